package main

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A minimal io_uring (io_uring_setup(2), io_uring_enter(2)) for method (u)
// of the plug bench: sync_file_range(SYNC_FILE_RANGE_WRITE) of a batch of
// files submitted with one system call. It is an experiment of the bench,
// not part of the daemon: the kernel runs each IORING_OP_SYNC_FILE_RANGE
// on an io-wq worker thread (it may block), so what it saves is the
// system call entries, not the writeback work.

const (
	ioringOffSQRing       = 0
	ioringOffCQRing       = 0x8000000
	ioringOffSQEs         = 0x10000000
	ioringOpSyncFileRange = 8 // IORING_OP_SYNC_FILE_RANGE
	ioringEnterGetEvents  = 1 // IORING_ENTER_GETEVENTS
	ioringFeatSingleMmap  = 1 // IORING_FEAT_SINGLE_MMAP
	ringEntries           = 256
	sqeSize, cqeSize      = 64, 16
	ioUringParamsSize     = 120
)

// uringParams mirrors struct io_uring_params (120 bytes).
type uringParams struct {
	SQEntries, CQEntries, Flags, SQThreadCPU, SQThreadIdle, Features, WQFd uint32
	Resv                                                                   [3]uint32
	SQOff                                                                  [10]uint32 // head, tail, ring_mask, ring_entries, flags, dropped, array, resv1, user_addr (u64)
	CQOff                                                                  [10]uint32 // head, tail, ring_mask, ring_entries, overflow, cqes, flags, resv1, user_addr (u64)
}

// uring is an io_uring instance: its descriptor, its three mappings (cq is
// sq when the kernel maps both rings at once) and the offsets it gave.
type uring struct {
	fd           int
	sq, cq, sqes []byte
	p            uringParams
}

// newUring sets up a ring of entries submission entries and maps it.
func newUring(entries uint32) (*uring, error) {
	var p uringParams
	if unsafe.Sizeof(p) != ioUringParamsSize {
		return nil, fmt.Errorf("io_uring_params is %d bytes here", unsafe.Sizeof(p))
	}
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		return nil, fmt.Errorf("io_uring_setup: %w", errno)
	}
	u := &uring{fd: int(fd), p: p}
	sqSize := int(p.SQOff[6]) + int(p.SQEntries)*4
	cqSize := int(p.CQOff[5]) + int(p.CQEntries)*cqeSize
	if p.Features&ioringFeatSingleMmap != 0 {
		sqSize = max(sqSize, cqSize)
	}
	var err error
	if u.sq, err = unix.Mmap(u.fd, ioringOffSQRing, sqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		u.Close()
		return nil, fmt.Errorf("mmap SQ ring: %w", err)
	}
	if p.Features&ioringFeatSingleMmap != 0 {
		u.cq = u.sq
	} else if u.cq, err = unix.Mmap(u.fd, ioringOffCQRing, cqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		u.Close()
		return nil, fmt.Errorf("mmap CQ ring: %w", err)
	}
	if u.sqes, err = unix.Mmap(u.fd, ioringOffSQEs, int(p.SQEntries)*sqeSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		u.Close()
		return nil, fmt.Errorf("mmap SQEs: %w", err)
	}
	return u, nil
}

// u32 is the 32-bit field at off in the mapping b.
func (u *uring) u32(b []byte, off uint32) *uint32 { return (*uint32)(unsafe.Pointer(&b[off])) }

// syncFileRanges starts writeback of each descriptor's file
// (SYNC_FILE_RANGE_WRITE, whole file), at most SQEntries at a time, and
// waits for every completion; it returns the first error.
func (u *uring) syncFileRanges(fds []int) error {
	var first error
	for len(fds) > 0 {
		n := min(len(fds), int(u.p.SQEntries))
		mask := *u.u32(u.sq, u.p.SQOff[2])
		tail := atomic.LoadUint32(u.u32(u.sq, u.p.SQOff[1]))
		for i := range n {
			idx := (tail + uint32(i)) & mask
			sqe := u.sqes[idx*sqeSize : (idx+1)*sqeSize]
			clear(sqe)
			sqe[0] = ioringOpSyncFileRange
			*(*int32)(unsafe.Pointer(&sqe[4])) = int32(fds[i])
			*(*uint32)(unsafe.Pointer(&sqe[28])) = unix.SYNC_FILE_RANGE_WRITE
			*(*uint64)(unsafe.Pointer(&sqe[32])) = uint64(i)
			*u.u32(u.sq, u.p.SQOff[6]+idx*4) = idx
		}
		atomic.StoreUint32(u.u32(u.sq, u.p.SQOff[1]), tail+uint32(n))
		done := 0
		submit := n
		for done < n {
			_, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(u.fd), uintptr(submit), uintptr(n-done), ioringEnterGetEvents, 0, 0)
			if errno != 0 && errno != unix.EINTR {
				return fmt.Errorf("io_uring_enter: %w", errno)
			}
			submit = 0
			head := atomic.LoadUint32(u.u32(u.cq, u.p.CQOff[0]))
			ctail := atomic.LoadUint32(u.u32(u.cq, u.p.CQOff[1]))
			cmask := *u.u32(u.cq, u.p.CQOff[2])
			for ; head != ctail; head++ {
				cqe := u.cq[u.p.CQOff[5]+(head&cmask)*cqeSize:]
				if res := *(*int32)(unsafe.Pointer(&cqe[8])); res < 0 && first == nil {
					first = fmt.Errorf("sync_file_range (io_uring): %w", unix.Errno(-res))
				}
				done++
			}
			atomic.StoreUint32(u.u32(u.cq, u.p.CQOff[0]), head)
		}
		fds = fds[n:]
	}
	return first
}

// Close unmaps the rings and closes the ring's descriptor.
func (u *uring) Close() {
	if u.sqes != nil {
		unix.Munmap(u.sqes)
	}
	if u.cq != nil && (u.sq == nil || &u.cq[0] != &u.sq[0]) {
		unix.Munmap(u.cq) // a mapping of its own
	}
	if u.sq != nil {
		unix.Munmap(u.sq)
	}
	unix.Close(u.fd)
}

// uringStartWriteback opens the set's files in batches of the ring's size,
// starts their writeback through the ring (one io_uring_enter per batch,
// waiting for the batch's completions), and closes them: method (u).
func uringStartWriteback(s *fileSet) error {
	u, err := newUring(ringEntries)
	if err != nil {
		return err
	}
	defer u.Close()
	fds := make([]int, 0, ringEntries)
	flush := func() error {
		err := u.syncFileRanges(fds)
		for _, fd := range fds {
			unix.Close(fd)
		}
		fds = fds[:0]
		return err
	}
	for _, p := range s.paths {
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			flush()
			return err
		}
		if fds = append(fds, fd); len(fds) == ringEntries {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	return flush()
}
