package control

// Status is a "status" answer: a line per configured tree, then the
// devices.
type Status struct {
	Trees   []TreeStatus   `json:"trees"`
	Devices []DeviceStatus `json:"devices"`
}

// TreeStatus is one configured tree's figures. Sizes are bytes; the page
// counts are cachestat(2)'s as last seen, the same as the stats files'.
type TreeStatus struct {
	Root           Name    `json:"root"`
	Mode           string  `json:"mode"` // "writeback" or "integrity"
	ExpireSeconds  float64 `json:"expire_seconds"`
	Backend        string  `json:"backend"` // "fanotify" or "inotify"
	Served         bool    `json:"served"`  // false while its root is gone
	Tracked        int     `json:"tracked"`
	Dirty          int     `json:"dirty"` // files with dirty data
	DirtyBytes     uint64  `json:"dirty_bytes"`
	WritebackBytes uint64  `json:"writeback_bytes"`
	// OldestDirtySeconds is the age of its oldest dirty data (0: none).
	OldestDirtySeconds float64 `json:"oldest_dirty_seconds"`
	WrittenBytes       uint64  `json:"written_bytes"` // by flusherd, since the start
	Errors             uint64  `json:"errors"`        // failed attempts, since the start
	Blocked            int     `json:"blocked"`       // on b_more_io_wait
	Failed             int     `json:"failed"`        // data lost, until written again
	// Exposure: how long data stayed dirty before flusherd began
	// writing it, over the last 10 minutes.
	Exposure Exposure `json:"exposure"`
}

// Exposure is a tree's exposure over the last 10 minutes: the number of
// files flusherd began writing, the p50 and p99 (upper bounds of the
// histogram buckets that hold them) and the largest, in seconds.
type Exposure struct {
	Count      uint64  `json:"count"`
	P50Seconds float64 `json:"p50_seconds"`
	P99Seconds float64 `json:"p99_seconds"`
	MaxSeconds float64 `json:"max_seconds"`
}

// DeviceStatus is one device's figures (those of its stats file).
type DeviceStatus struct {
	Bdi            string `json:"bdi"`
	Tracked        int    `json:"tracked"`
	DirtyBytes     uint64 `json:"dirty_bytes"`
	WritebackBytes uint64 `json:"writeback_bytes"`
	// WindowBytes is what may be under writeback before big files wait
	// (window_bytes); 0: no bound.
	WindowBytes uint64 `json:"window_bytes"`
	// PaceBytesPerSec is the pace writeback is started at (pace_kBps
	// in bytes/s); 0: none.
	PaceBytesPerSec uint64 `json:"pace_bytes_per_sec"`
	WrittenBytes    uint64 `json:"written_bytes"`
	Errors          uint64 `json:"errors"`
	FailedFiles     int    `json:"failed_files"`
	StuckCalls      int    `json:"stuck_calls"`
	Probing         bool   `json:"probing"`
	// SweepCandidates are the files open or mapped in the trees that
	// the sweep looks at; SweepFound counts those it found dirty
	// without an event (sweep_candidates, sweep_found).
	SweepCandidates int    `json:"sweep_candidates"`
	SweepFound      uint64 `json:"sweep_found"`
}
