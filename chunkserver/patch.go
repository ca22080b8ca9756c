package chunkserver

import (
	"github.com/rdmafs/rdmafs/chunkserver/chunk"
	"github.com/rdmafs/rdmafs/chunkserver/mempool"
	"github.com/rdmafs/rdmafs/chunkserver/proto"
	"github.com/rdmafs/rdmafs/rdma"
)

// Partial-stripe writes: a new version derived on chunkd from a base version of
// the same chunk, by a patch (PreparePatch or PatchSlab, then Commit) or as a
// copy (Clone).
// The new version is stored like any other (store.Put: complete, checksummed,
// durable); the base is never modified.

// checkBase checks that base may be the base of the new version key: 0 < base <
// key.Version and (key.Chunk, base) stored. It returns the base's info, or the
// status to answer.
func (c *conn) checkBase(key chunk.Key, base chunk.Version) (chunk.Info, proto.Status) {
	if base == 0 || base >= key.Version {
		return chunk.Info{}, proto.StatusInvalid
	}
	info, err := c.s.store.Stat(chunk.Key{Chunk: key.Chunk, Version: base})
	if err != nil {
		return chunk.Info{}, statusOf(err)
	}
	return info, proto.StatusOK
}

// preparePatch reserves the staging of a patch of length bytes that derives key
// from (key.Chunk, base): as prepare does for a plain write, except that the
// disk room claimed is the base's length. A staging too short for a patch
// header answers StatusInvalid. With src (a patch from the slab) the staging
// holds a copy of src and grants the client nothing.
func (c *conn) preparePatch(key chunk.Key, length int, base chunk.Version, src []byte) proto.Reply {
	info, status := c.checkBase(key, base)
	if status != proto.StatusOK {
		return proto.Reply{Status: status}
	}
	if length < proto.PatchHeaderLen(0) {
		return proto.Reply{Status: proto.StatusInvalid}
	}
	return c.prepare(key, stageSpec{length: length, base: base, baseLen: int(info.Length), src: src})
}

// grantSlab answers the connection's slab, granting it on first use: a buffer
// of SlabPerConn bytes held until the connection ends, and a window granting
// the client remote write of it. The slabs of all connections together are
// bounded by an eighth of the registered memory (beyond it: StatusBusy, and
// the client stages its patches as before); they are not counted in a
// connection's staging quota, so a connection with a slab can still stage a
// version of the largest length.
func (c *conn) grantSlab() proto.Reply {
	s := c.s
	size := s.cfg.SlabPerConn
	if size == 0 {
		return proto.Reply{Status: proto.StatusInvalid}
	}
	c.mu.Lock()
	switch {
	case c.slab.buf.Size != 0:
		rep := c.slab.rep
		c.mu.Unlock()
		return rep
	case c.staging == nil:
		c.mu.Unlock()
		return proto.Reply{Status: proto.StatusShuttingDown}
	}
	c.mu.Unlock()
	if s.slabBytes.Add(int64(size)) > int64(s.cfg.MemBytes/8) {
		s.slabBytes.Add(-int64(size))
		return proto.Reply{Status: proto.StatusBusy}
	}
	sl := slab{}
	undo := func(status proto.Status) proto.Reply {
		if sl.mw != nil {
			c.mws <- sl.mw
		}
		if sl.buf.Size != 0 {
			s.pool.Free(sl.buf)
		}
		s.slabBytes.Add(-int64(size))
		c.mu.Lock()
		rep := c.slab.rep // a concurrent grant that won
		c.mu.Unlock()
		if status == proto.StatusOK {
			return rep
		}
		return proto.Reply{Status: status}
	}
	var err error
	if sl.buf, err = s.cache.alloc(size); err != nil {
		c.noteErr("slab", chunk.Key{}, err)
		return undo(proto.StatusBusy)
	}
	select {
	case sl.mw = <-c.mws:
	default:
		return undo(proto.StatusBusy)
	}
	addr := s.pool.Addr(sl.buf)
	rkey, err := c.qp.BindMW(sl.mw, s.pool.MR(), addr, uint64(size), rdma.AccessRemoteWrite)
	if err != nil {
		c.noteErr("bind", chunk.Key{}, err)
		return undo(proto.StatusBusy)
	}
	sl.rep = proto.Reply{Addr: addr, RKey: rkey, Length: uint32(size)}
	c.mu.Lock()
	if c.staging == nil || c.slab.buf.Size != 0 {
		closing := c.staging == nil
		c.mu.Unlock()
		c.qp.InvalidateMW(sl.mw)
		if closing {
			return undo(proto.StatusShuttingDown)
		}
		return undo(proto.StatusOK)
	}
	c.slab = sl
	c.mu.Unlock()
	s.metrics.StagingBytes.Add(float64(size))
	return sl.rep
}

// patchFromSlab stages, as preparePatch does, the patch of req.Length bytes the
// client wrote into the connection's slab at req.Slab: the bytes are copied out
// of the slab now, so that the commit that follows verifies and applies bytes
// the client can no longer change. A range outside the slab, or no slab,
// answers StatusInvalid.
func (c *conn) patchFromSlab(key chunk.Key, req *proto.Request) proto.Reply {
	c.mu.Lock()
	sl := c.slab
	c.mu.Unlock()
	n, off := int(req.Length), int(req.Slab)
	if sl.buf.Size == 0 || off+n > int(sl.rep.Length) {
		return proto.Reply{Status: proto.StatusInvalid}
	}
	// A staging of the same version this connection left (an abandoned
	// prepare) goes: the Commit that follows must apply this patch or
	// nothing, never that staging.
	c.mu.Lock()
	old := c.staging[key]
	delete(c.staging, key)
	c.mu.Unlock()
	if old != nil {
		c.endStaging(old)
	}
	rep := c.preparePatch(key, n, req.Base, c.s.pool.Bytes(sl.buf)[off:off+n])
	return proto.Reply{Status: rep.Status}
}

// commitPatch builds and stores the version of a patch staging whose window is
// revoked and whose patch bytes are verified: the base
// pinned through the cache, copied into a new buffer, the patch applied, the
// result checksummed, stored and made resident. The caller ends the staging.
func (c *conn) commitPatch(st *staging, patch []byte) proto.Reply {
	s := c.s
	key := st.key
	baseKey := chunk.Key{Chunk: key.Chunk, Version: st.base}
	res, err := s.cache.acquire(c.ctx, baseKey)
	if err != nil {
		c.noteErr("patch base", key, err)
		return proto.Reply{Status: statusOf(err)}
	}
	defer s.cache.release(res)
	// A version being deleted may still be resident for a moment: the base
	// must be stored now, with its bytes pinned.
	if _, err := s.store.Stat(baseKey); err != nil {
		return proto.Reply{Status: statusOf(err)}
	}
	n := int(res.info.Length)
	buf, err := s.cache.alloc(n)
	if err != nil {
		c.noteErr("patch", key, err)
		return proto.Reply{Status: statusOf(err)}
	}
	data := s.pool.Bytes(buf)[:n]
	copy(data, s.pool.Bytes(res.buf)[:n])
	if err := proto.ApplyPatch(data, patch); err != nil {
		s.pool.Free(buf)
		s.metrics.Errors.WithLabelValues("patch").Inc()
		c.log.Debug("chunkd: bad patch", "chunk", key, "base", st.base, "err", err)
		return proto.Reply{Status: proto.StatusInvalid}
	}
	crc := checksum(data)
	if err := s.store.Put(key, data, crc); err != nil {
		s.pool.Free(buf)
		c.noteErr("commit", key, err)
		return proto.Reply{Status: statusOf(err)}
	}
	s.cache.insert(chunk.Info{Key: key, Length: uint32(n), CRC: crc}, buf)
	s.metrics.BytesWritten.Add(float64(n))
	s.updateStoreGauges()
	return proto.Reply{Length: uint32(n), CRC: crc}
}

// clone stores key as a copy of (key.Chunk, base), written straight from the
// base's pinned resident copy, and answers {Length, CRC} once it is durable.
// A clone of a key already stored with the base's length and CRC answers OK (a
// retried clone); a key stored otherwise, or being written, StatusExists. The
// clone is not made resident: it is read, if ever, from disk.
func (c *conn) clone(key chunk.Key, base chunk.Version) proto.Reply {
	s := c.s
	binfo, status := c.checkBase(key, base)
	if status != proto.StatusOK {
		return proto.Reply{Status: status}
	}
	if info, err := s.store.Stat(key); err == nil {
		if info.Length == binfo.Length && info.CRC == binfo.CRC {
			return proto.Reply{Length: info.Length, CRC: info.CRC}
		}
		return proto.Reply{Status: proto.StatusExists}
	}
	if !s.stage(key, c) {
		return proto.Reply{Status: proto.StatusExists}
	}
	defer s.unstage(key, c)
	err := s.store.Claim(key, int(binfo.Length))
	c.noteClaim(key, err)
	if err != nil {
		return proto.Reply{Status: statusOf(err)}
	}
	defer s.store.Unclaim(key) // a no-op once Put took the claim
	baseKey := chunk.Key{Chunk: key.Chunk, Version: base}
	res, err := s.cache.acquire(c.ctx, baseKey)
	if err != nil {
		c.noteErr("clone", key, err)
		return proto.Reply{Status: statusOf(err)}
	}
	defer s.cache.release(res)
	if _, err := s.store.Stat(baseKey); err != nil { // deleted while resident
		return proto.Reply{Status: statusOf(err)}
	}
	n := int(res.info.Length)
	data := s.pool.Bytes(res.buf)[:n]
	if n%mempool.Granularity != 0 {
		// The store writes a block-aligned buffer with room past its end
		// with direct I/O and zeroes the padding in place: not in a
		// resident copy that other clones may be writing from at the same
		// time. Without the room it writes through the page cache.
		data = data[:n:n]
	}
	if err := s.store.Put(key, data, res.info.CRC); err != nil {
		c.noteErr("clone", key, err)
		return proto.Reply{Status: statusOf(err)}
	}
	s.metrics.BytesWritten.Add(float64(n))
	s.updateStoreGauges()
	return proto.Reply{Length: uint32(n), CRC: res.info.CRC}
}
