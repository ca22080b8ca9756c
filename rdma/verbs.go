package rdma

import (
	"fmt"
	"unsafe"
)

// Opcode is a send work request opcode (enum ibv_wr_opcode).
type Opcode uint32

// Send work request opcodes, numbered as in <infiniband/verbs.h>.
const (
	OpRDMAWrite        Opcode = 0 // IBV_WR_RDMA_WRITE
	OpRDMAWriteWithImm Opcode = 1 // IBV_WR_RDMA_WRITE_WITH_IMM
	OpSend             Opcode = 2 // IBV_WR_SEND
	OpSendWithImm      Opcode = 3 // IBV_WR_SEND_WITH_IMM
	OpRDMARead         Opcode = 4 // IBV_WR_RDMA_READ
)

var opcodeNames = map[Opcode]string{
	OpRDMAWrite: "RDMA_WRITE", OpRDMAWriteWithImm: "RDMA_WRITE_WITH_IMM",
	OpSend: "SEND", OpSendWithImm: "SEND_WITH_IMM", OpRDMARead: "RDMA_READ",
}

func (o Opcode) String() string {
	if s, ok := opcodeNames[o]; ok {
		return s
	}
	return fmt.Sprintf("Opcode(%d)", uint32(o))
}

// WCOpcode is the opcode of a work completion (enum ibv_wc_opcode).
type WCOpcode uint32

// Work completion opcodes, numbered as in <infiniband/verbs.h>.
const (
	WCSend            WCOpcode = 0   // IBV_WC_SEND
	WCRDMAWrite       WCOpcode = 1   // IBV_WC_RDMA_WRITE
	WCRDMARead        WCOpcode = 2   // IBV_WC_RDMA_READ
	WCRecv            WCOpcode = 128 // IBV_WC_RECV
	WCRecvRDMAWithImm WCOpcode = 129 // IBV_WC_RECV_RDMA_WITH_IMM
)

func (o WCOpcode) String() string {
	switch o {
	case WCSend:
		return "SEND"
	case WCRDMAWrite:
		return "RDMA_WRITE"
	case WCRDMARead:
		return "RDMA_READ"
	case WCRecv:
		return "RECV"
	case WCRecvRDMAWithImm:
		return "RECV_RDMA_WITH_IMM"
	}
	return fmt.Sprintf("WCOpcode(%d)", uint32(o))
}

// CompletionOpcode returns the work completion opcode that a successful send work
// request of opcode o produces on the initiator.
func (o Opcode) CompletionOpcode() WCOpcode {
	switch o {
	case OpRDMAWrite, OpRDMAWriteWithImm:
		return WCRDMAWrite
	case OpRDMARead:
		return WCRDMARead
	default:
		return WCSend
	}
}

// WCStatus is the status of a work completion (enum ibv_wc_status).
type WCStatus uint32

// Work completion status codes, numbered as in <infiniband/verbs.h>.
const (
	WCSuccess        WCStatus = 0  // IBV_WC_SUCCESS
	WCLocLenErr      WCStatus = 1  // IBV_WC_LOC_LEN_ERR: local buffer too small for the data
	WCLocQPOpErr     WCStatus = 2  // IBV_WC_LOC_QP_OP_ERR: malformed work request
	WCLocEECOpErr    WCStatus = 3  // IBV_WC_LOC_EEC_OP_ERR
	WCLocProtErr     WCStatus = 4  // IBV_WC_LOC_PROT_ERR: local SGE not covered by a valid lkey
	WCWRFlushErr     WCStatus = 5  // IBV_WC_WR_FLUSH_ERR: flushed because the QP is in error
	WCMWBindErr      WCStatus = 6  // IBV_WC_MW_BIND_ERR
	WCBadRespErr     WCStatus = 7  // IBV_WC_BAD_RESP_ERR
	WCLocAccessErr   WCStatus = 8  // IBV_WC_LOC_ACCESS_ERR
	WCRemInvReqErr   WCStatus = 9  // IBV_WC_REM_INV_REQ_ERR: the responder rejected the request
	WCRemAccessErr   WCStatus = 10 // IBV_WC_REM_ACCESS_ERR: bad rkey, rights or bounds on the responder
	WCRemOpErr       WCStatus = 11 // IBV_WC_REM_OP_ERR: the responder could not complete the operation
	WCRetryExcErr    WCStatus = 12 // IBV_WC_RETRY_EXC_ERR: the peer stopped answering
	WCRNRRetryExcErr WCStatus = 13 // IBV_WC_RNR_RETRY_EXC_ERR: no receive posted at the responder
	WCLocRDDViolErr  WCStatus = 14 // IBV_WC_LOC_RDD_VIOL_ERR
	WCRemInvRdReqErr WCStatus = 15 // IBV_WC_REM_INV_RD_REQ_ERR
	WCRemAbortErr    WCStatus = 16 // IBV_WC_REM_ABORT_ERR
	WCInvEECNErr     WCStatus = 17 // IBV_WC_INV_EECN_ERR
	WCInvEECStateErr WCStatus = 18 // IBV_WC_INV_EEC_STATE_ERR
	WCFatalErr       WCStatus = 19 // IBV_WC_FATAL_ERR
	WCRespTimeoutErr WCStatus = 20 // IBV_WC_RESP_TIMEOUT_ERR
	WCGeneralErr     WCStatus = 21 // IBV_WC_GENERAL_ERR
)

var statusNames = [...]string{
	"SUCCESS", "LOC_LEN_ERR", "LOC_QP_OP_ERR", "LOC_EEC_OP_ERR", "LOC_PROT_ERR",
	"WR_FLUSH_ERR", "MW_BIND_ERR", "BAD_RESP_ERR", "LOC_ACCESS_ERR", "REM_INV_REQ_ERR",
	"REM_ACCESS_ERR", "REM_OP_ERR", "RETRY_EXC_ERR", "RNR_RETRY_EXC_ERR",
	"LOC_RDD_VIOL_ERR", "REM_INV_RD_REQ_ERR", "REM_ABORT_ERR", "INV_EECN_ERR",
	"INV_EEC_STATE_ERR", "FATAL_ERR", "RESP_TIMEOUT_ERR", "GENERAL_ERR",
}

// String returns the verbs name of the status, as ibv_wc_status_str does.
func (s WCStatus) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("WCStatus(%d)", uint32(s))
}

// AccessFlags are memory region and window access rights (enum ibv_access_flags).
type AccessFlags uint32

// Access flags, numbered as in <infiniband/verbs.h>.
const (
	AccessLocalWrite   AccessFlags = 1 << 0 // IBV_ACCESS_LOCAL_WRITE
	AccessRemoteWrite  AccessFlags = 1 << 1 // IBV_ACCESS_REMOTE_WRITE
	AccessRemoteRead   AccessFlags = 1 << 2 // IBV_ACCESS_REMOTE_READ
	AccessRemoteAtomic AccessFlags = 1 << 3 // IBV_ACCESS_REMOTE_ATOMIC
	AccessMWBind       AccessFlags = 1 << 4 // IBV_ACCESS_MW_BIND
)

// SendFlags modify a send work request (enum ibv_send_flags).
type SendFlags uint32

// Send flags, numbered as in <infiniband/verbs.h>.
const (
	SendFence     SendFlags = 1 << 0 // IBV_SEND_FENCE
	SendSignaled  SendFlags = 1 << 1 // IBV_SEND_SIGNALED: produce a completion on success
	SendSolicited SendFlags = 1 << 2 // IBV_SEND_SOLICITED
	SendInline    SendFlags = 1 << 3 // IBV_SEND_INLINE
)

// WCFlags describe a work completion (enum ibv_wc_flags).
type WCFlags uint32

// Work completion flags, numbered as in <infiniband/verbs.h>.
const (
	WCWithImm WCFlags = 1 << 1 // IBV_WC_WITH_IMM: Imm is valid
)

// QPState is the state of a queue pair (enum ibv_qp_state).
type QPState uint32

// Queue pair states, numbered as in <infiniband/verbs.h>.
const (
	QPStateReset QPState = 0 // IBV_QPS_RESET
	QPStateInit  QPState = 1 // IBV_QPS_INIT
	QPStateRTR   QPState = 2 // IBV_QPS_RTR
	QPStateRTS   QPState = 3 // IBV_QPS_RTS
	QPStateSQD   QPState = 4 // IBV_QPS_SQD
	QPStateSQE   QPState = 5 // IBV_QPS_SQE
	QPStateErr   QPState = 6 // IBV_QPS_ERR
)

func (s QPState) String() string {
	names := [...]string{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"}
	if int(s) < len(names) {
		return names[s]
	}
	return fmt.Sprintf("QPState(%d)", uint32(s))
}

// SGE is a scatter-gather element (struct ibv_sge): Length bytes at virtual address
// Addr inside a memory region registered with local key LKey. Its layout is that of
// struct ibv_sge, so a slice of SGEs can be handed to libibverbs as it is.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// The layout of struct ibv_sge: 16 bytes, addr at 0, length at 8, lkey at 12.
var _ = [1]struct{}{}[unsafe.Sizeof(SGE{})-16]
var _ = [1]struct{}{}[unsafe.Offsetof(SGE{}.Length)-8]
var _ = [1]struct{}{}[unsafe.Offsetof(SGE{}.LKey)-12]

// SendWR is a send work request (struct ibv_send_wr) without the list link: post a
// slice of them to post a list. The SGL is copied when the request is posted, so the
// caller may reuse it at once; the memory it points to must stay registered and
// untouched until the request completes.
type SendWR struct {
	ID         uint64 // wr_id, returned in the completion
	Opcode     Opcode
	Flags      SendFlags
	SGL        []SGE  // sg_list: gathered for SEND/WRITE, scattered into for READ
	Imm        uint32 // imm_data for the _WITH_IMM opcodes
	RemoteAddr uint64 // wr.rdma.remote_addr
	RKey       uint32 // wr.rdma.rkey
}

// RecvWR is a receive work request (struct ibv_recv_wr) without the list link.
type RecvWR struct {
	ID  uint64
	SGL []SGE
}

// WorkCompletion is a completion queue entry (struct ibv_wc, the fields that matter).
type WorkCompletion struct {
	ID      uint64 // wr_id of the work request
	Status  WCStatus
	Opcode  WCOpcode
	Flags   WCFlags
	ByteLen uint32 // bytes received (receives) or transferred (RDMA_READ)
	Imm     uint32 // valid when Flags has WCWithImm
	QPNum   uint32 // the queue pair the request was posted on
}

// Limits that every transport honours so that code written for one runs on all.
const (
	// MaxConnectPrivateData is the private data a Connect may carry (an InfiniBand
	// REQ carries 56 bytes; rdma_cm reserves none of them for TCP transports).
	MaxConnectPrivateData = 56
	// MaxAcceptPrivateData is the private data an Accept or Reject may carry.
	MaxAcceptPrivateData = 196
)
