// Package rdma models the libibverbs / librdmacm programming interface so that code
// written against it runs unchanged on an RDMA NIC and, through software transports,
// on machines without one.
//
// The objects are those of verbs: a Device (ibv_context) hands out protection
// domains and completion queues; a ProtectionDomain registers memory regions, allocates
// memory windows and creates queue pairs; a QueuePair is connected in the manner of
// rdma_cm (Listen / Accept / Connect, with private data) and carries work requests
// (SEND, SEND_WITH_IMM, RDMA_WRITE, RDMA_WRITE_WITH_IMM, RDMA_READ) whose
// scatter-gather lists point into registered memory; a CompletionQueue reports their
// completions with the verbs status codes. Constants and the SGE layout match
// <infiniband/verbs.h>.
//
// Registered memory is allocated outside the Go heap (memfd + mmap, prefaulted) by
// AllocMemory, so the same buffers can be handed to a NIC, read into by a software
// transport, or mapped by a same-host peer. Register memory once, up front, and reuse
// it: registration is slow on real hardware and never belongs on an I/O path.
//
// This package knows nothing of files, chunks or the rest of rdmafs. Transports live
// in sub-packages (rdma/tcp, ...) and all pass the conformance suite in rdma/rdmatest.
package rdma
