// Package verbs is the rdma transport for RDMA NICs (InfiniBand, RoCE, iWARP,
// Soft-RoCE): libibverbs and librdmacm through cgo. It builds only with the verbs
// build tag (go build -tags verbs), so the pure-Go build never needs cgo or the
// RDMA libraries.
//
// Registered memory comes from rdma.AllocMemory (memfd mappings, outside the Go
// heap) and is registered with ibv_reg_mr. A batch of work requests is posted with
// one cgo call, from arrays allocated in C memory when the queue pair is created;
// no Go pointer is ever handed to C. Completions are waited for through Go's
// poller on the completion channel's descriptor, never by spinning. Queue pairs
// are created with ibv_create_qp and connected through rdma_cm with the queue pair
// managed by the caller (rdma_init_qp_attr drives its state transitions).
//
// Memory windows are type 2: BindMW and InvalidateMW post unsignaled
// IBV_WR_BIND_MW / IBV_WR_LOCAL_INV requests (wr_id InternalWRID) on the queue
// pair, so they take effect in order with the requests posted after them; a
// failure completes on the send CQ with that wr_id.
package verbs
