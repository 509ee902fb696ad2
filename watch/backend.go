package watch

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"flusherd/inode"
	"flusherd/internal/logpath"
	"flusherd/tree"
)

// Options configure New.
type Options struct {
	// Backend is "auto", "fanotify" or "inotify".
	Backend string
	// Opener opens files for the cachestat scans; nil means Handles if
	// set, else inode.OS.
	Opener inode.Opener
	// Handles, if set, opens files by handle: fanotify needs it, and a
	// filesystem mounted inside a tree is registered with it. Nil: opens
	// by path only (no fanotify).
	Handles *inode.Handles
	// RescanInterval is the period of the rescans of directories inotify
	// could not watch.
	RescanInterval time.Duration
	// RetryMin and RetryMax bound the backoff of the rescans that follow
	// a scan or event left incomplete for want of descriptors or memory
	// (0: 1s and 30s). The daemon passes writeback.min_pause and
	// max_pause, so such files are written within max_pause of the
	// shortage's end, like blocked ones.
	RetryMin, RetryMax time.Duration
	// StatsDir, if set, gets <StatsDir>/watch/stats (WriteStats).
	StatsDir string
	Log      *zap.Logger
	// Progress, if set, is called once per tree as New sets it up (its
	// filesystem offered a fanotify mark and registered for opens by
	// handle: opens that are slow on a slow filesystem), so that a
	// caller can report start-up progress (EXTEND_TIMEOUT_USEC).
	Progress func()

	// Opens: the opens and closes of the trees' files are reported to
	// Sink.InodesOpened, for the sweep of files dirtied without an event
	// (watcher.sweep_interval not "0"): fanotify adds FAN_OPEN and
	// FAN_CLOSE_NOWRITE to its marks, inotify IN_OPEN and the closes to
	// its watches (a name is reported once open for openGrace).
	Opens bool

	// noTargetFID makes the fanotify group without FAN_REPORT_TARGET_FID,
	// as on a kernel older than 5.17 (tests of the look-up by name).
	noTargetFID bool
}

func (o *Options) progress() {
	if o.Progress != nil {
		o.Progress()
	}
}

// TreeError is a tree that a backend cannot serve, and why.
type TreeError struct {
	Root string
	Err  error
}

func (e *TreeError) Error() string {
	return fmt.Sprintf("tree %s: %v", strconv.Quote(e.Root), e.Err)
}

func (e *TreeError) Unwrap() error { return e.Err }

// fanotifyRefused is the log message for a tree that fanotify does not
// serve: a missing privilege (EPERM: filesystem marks need CAP_SYS_ADMIN,
// opens by handle CAP_DAC_READ_SEARCH) is not the filesystem's doing.
func fanotifyRefused(err error) string {
	if errors.Is(err, unix.EPERM) {
		return "fanotify is not permitted (it needs CAP_SYS_ADMIN and CAP_DAC_READ_SEARCH, which the daemon does not have); this tree is served by inotify"
	}
	if errors.Is(err, errSecondMount) {
		return "this tree is on a filesystem that fanotify serves through another mount (a bind mount), where its files have other paths; it is served by inotify"
	}
	if errors.Is(err, ErrSharedFsid) {
		return "this tree's filesystem has the fsid of another marked filesystem, so fanotify cannot tell their events apart; it is served by inotify"
	}
	if errors.Is(err, unix.EACCES) {
		return "the daemon may not read this tree's root (permission denied), so fanotify cannot mark it; it is tried with inotify"
	}
	return "this tree's filesystem refuses fanotify; it is served by inotify"
}

// New returns the backend opt.Backend asks for. "auto" picks fanotify when
// the process may use it (CAP_SYS_ADMIN, and the kernel accepts
// FAN_REPORT_DFID_NAME|FAN_REPORT_FID with a filesystem mark on every
// tree) and inotify otherwise, and logs which and why. An explicit
// "fanotify" that cannot be set up is an error.
func New(trees []tree.Tree, sink Sink, opt Options) (Backend, error) {
	log := opt.Log
	if log == nil {
		log = zap.NewNop()
	}
	switch opt.Backend {
	case "inotify":
		log.Info("watch backend: inotify (configured)")
		return NewInotify(trees, sink, opt)
	case "fanotify":
		return newConfiguredFanotify(trees, sink, opt, log)
	case "auto", "":
		return newAuto(trees, sink, opt, log)
	}
	return nil, fmt.Errorf("unknown watch backend %q", opt.Backend)
}

// newConfiguredFanotify is New for backend = "fanotify": a tree it cannot
// serve is an ErrBackendRefused that says why.
func newConfiguredFanotify(trees []tree.Tree, sink Sink, opt Options, log *zap.Logger) (Backend, error) {
	f, err := NewFanotify(trees, sink, opt)
	if te := (*TreeError)(nil); errors.As(err, &te) {
		root := strconv.Quote(te.Root)
		switch {
		case errors.Is(te.Err, unix.EPERM):
			return nil, fmt.Errorf("%w: backend = \"fanotify\", but fanotify is not permitted for %s (%v): it needs CAP_SYS_ADMIN and CAP_DAC_READ_SEARCH (run as root, as the shipped unit does); set backend = \"auto\" or \"inotify\" to run without them",
				ErrBackendRefused, root, te.Err)
		case errors.Is(te.Err, unix.EACCES):
			return nil, fmt.Errorf("%w: backend = \"fanotify\", but the daemon may not read the tree %s (%v)",
				ErrBackendRefused, root, te.Err)
		}
		return nil, fmt.Errorf("%w: backend = \"fanotify\", but the filesystem of %s refuses it (%v); set backend = \"auto\" to serve that tree with inotify and the others with fanotify",
			ErrBackendRefused, root, te.Err)
	}
	if err != nil {
		return nil, fmt.Errorf("fanotify backend: %w", err)
	}
	log.Info("watch backend: fanotify (configured)")
	return f, nil
}

// newAuto is New for backend = "auto", per filesystem: fanotify where the
// mark is taken, inotify for the trees whose filesystem refuses it.
func newAuto(trees []tree.Tree, sink Sink, opt Options, log *zap.Logger) (Backend, error) {
	f, refused, err := newFanotifyFor(trees, sink, opt)
	if err != nil {
		log.Info("watch backend: inotify (auto: fanotify unavailable)", zap.Error(budgetErr(err, fanotifyGroups)))
		return NewInotify(trees, sink, opt)
	}
	var inTrees []tree.Tree
	for _, r := range refused {
		log.Info(fanotifyRefused(r.Err), logpath.String("root", r.Root), zap.Error(r.Err))
		for _, t := range trees {
			if t.Root == r.Root {
				inTrees = append(inTrees, t)
			}
		}
	}
	// The inotify half exists even without trees: a reload may add
	// a tree whose filesystem refuses fanotify, or a filesystem that
	// refuses it may be mounted inside a tree. Without an instance left
	// (a budget shared with every process of the user), fanotify serves
	// its trees alone, and says what it cannot serve.
	in, err := NewInotify(inTrees, sink, opt)
	if err != nil && len(inTrees) == 0 {
		log.Warn("no inotify instance for what fanotify cannot serve: the trees are served with fanotify, but a tree added later, or a filesystem mounted inside one, that refuses a fanotify mark is not", zap.Error(err))
		log.Info("watch backend: fanotify (auto: filesystem marks accepted)")
		return f, nil
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	switch {
	case len(refused) == 0:
		log.Info("watch backend: fanotify (auto: filesystem marks accepted)")
	case len(inTrees) == len(trees):
		why := "no tree's filesystem takes a fanotify mark"
		if len(refused) > 0 && errors.Is(refused[0].Err, unix.EPERM) {
			why = "fanotify needs CAP_SYS_ADMIN and CAP_DAC_READ_SEARCH"
		}
		log.Info("watch backend: inotify (auto: " + why + ")")
	default:
		log.Info("watch backend: fanotify+inotify (auto: per filesystem)",
			zap.Int("fanotify_trees", len(trees)-len(inTrees)), zap.Int("inotify_trees", len(inTrees)))
	}
	return newMixed(f, in), nil
}

// ErrBackendRefused is New's error when an explicitly configured backend
// cannot serve a tree (fanotify on a filesystem that refuses a mark, such
// as FUSE or a btrfs subvolume, or without the privileges it needs), and a
// backend's Start error for a tree root the daemon may not read (EACCES,
// EPERM from inotify_add_watch): a configuration error.
var ErrBackendRefused = errors.New("configuration error")
