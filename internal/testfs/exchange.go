package testfs

import (
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Exchange swaps each pair of paths with renameat2(RENAME_EXCHANGE), all
// pairs in turn, over and over on a goroutine of its own, sleeping pause
// after every every-th round (pause 0: no sleep), until the returned stop
// is called; stop waits for the goroutine and returns the rounds made. A
// failed swap is reported with t.Error and ends the swapping.
func Exchange(t T, pause time.Duration, every int64, pairs ...[2]string) (stop func() int64) {
	done := make(chan struct{})
	var rounds atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			for _, p := range pairs {
				if err := unix.Renameat2(unix.AT_FDCWD, p[0], unix.AT_FDCWD, p[1], unix.RENAME_EXCHANGE); err != nil {
					t.Errorf("renameat2(%s, %s, RENAME_EXCHANGE): %v", p[0], p[1], err)
					return
				}
			}
			if n := rounds.Add(1); pause > 0 && n%max(every, 1) == 0 {
				time.Sleep(pause)
			}
		}
	})
	return func() int64 {
		close(done)
		wg.Wait()
		return rounds.Load()
	}
}
