package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"flusherd/config"
	"flusherd/tree"
)

// DefaultConfigPath is the configuration file read without --config, when
// it exists.
const DefaultConfigPath = "/etc/flusherd/flusherd.toml"

// ConfigFlags are the flags shared by the commands that read the
// configuration: --config and --stats-dir.
type ConfigFlags struct {
	Config   string
	StatsDir string
}

// Register adds --config and --stats-dir to fs.
func (c *ConfigFlags) Register(fs *flag.FlagSet) {
	fs.Var(NonEmpty{P: &c.Config}, "config", "configuration `file` (default "+DefaultConfigPath+" if it exists)")
	fs.Var(NonEmpty{P: &c.StatsDir}, "stats-dir", "`directory` of the stats files and the control socket; overrides stats.dir (default /run/flusherd)")
}

// ReadsFile reports whether Load reads a configuration file: --config was
// given, or the default file exists.
func (c *ConfigFlags) ReadsFile() bool {
	if c.Config != "" {
		return true
	}
	_, err := os.Stat(DefaultConfigPath)
	return err == nil
}

// Load reads the configuration (config.Load): --config, else the default
// path if it exists, else the defaults. It applies --stats-dir and adds a
// writeback tree for each of watches (--watch).
func (c *ConfigFlags) Load(watches []string) (*config.Config, error) {
	return c.load(config.Load, watches)
}

// LoadKeeping is Load for a reload (config.LoadKeeping): a watch path
// whose root cannot be reached for its filesystem's sake is not a problem
// where keep says so, in the file and among watches; the result's
// Validate does the same.
func (c *ConfigFlags) LoadKeeping(watches []string, keep func(root string, err error) bool) (*config.Config, error) {
	cfg, err := c.load(func(path string) (*config.Config, error) { return config.LoadKeeping(path, keep) }, watches)
	if err == nil {
		cfg.SetKeep(keep)
	}
	return cfg, err
}

// LoadClient is Load for the client commands (stats, dirty, sync, status),
// which read stats.dir only: with --stats-dir no file is read; the watch
// paths are not looked at, so they work while a watched filesystem is
// dead, which is when they are needed; and a file whose problems are
// outside stats.dir (one a reload refused, which the daemon still runs
// without) gives its stats.dir, its problems written to warn after
// "flusherd cmd: warning:" (config.LoadClient).
func (c *ConfigFlags) LoadClient(cmd string, warn io.Writer) (*config.Config, error) {
	if c.StatsDir != "" {
		return c.load(func(string) (*config.Config, error) { return config.Default(), nil }, nil)
	}
	return c.load(func(path string) (*config.Config, error) {
		cfg, others, err := config.LoadClient(path)
		if err == nil && others != nil {
			fmt.Fprintf(warn, "flusherd %s: warning: %s has problems (see check-config; the daemon will not load it as it is); its stats.dir, %s, is used:\n%s\n",
				cmd, path, cfg.Stats.Dir, others)
		}
		return cfg, err
	}, nil)
}

func (c *ConfigFlags) load(load func(string) (*config.Config, error), watches []string) (*config.Config, error) {
	var cfg *config.Config
	switch {
	case c.Config != "":
		var err error
		if cfg, err = load(c.Config); err != nil {
			return nil, err
		}
	default:
		if _, err := os.Stat(DefaultConfigPath); err == nil {
			if cfg, err = load(DefaultConfigPath); err != nil {
				return nil, err
			}
		} else {
			cfg = config.Default()
		}
	}
	if c.StatsDir != "" {
		abs, err := filepath.Abs(c.StatsDir)
		if err != nil {
			return nil, err
		}
		cfg.Stats.Dir = abs
	}
	for _, w := range watches {
		if w == "" {
			return nil, errors.New("--watch: empty directory name")
		}
		abs, err := filepath.Abs(w)
		if err != nil {
			return nil, err
		}
		// A directory the file watches already is an error of
		// Validate's ("already watched"), not silently dropped: the
		// two entries may differ in mode and expiry.
		cfg.Watch = append(cfg.Watch, config.Watch{
			Tree: tree.Tree{
				Root:      abs,
				Recursive: true,
				Mode:      tree.ModeWriteback,
				Expire:    cfg.Writeback.DirtyExpireInterval,
			},
			Flag: "--watch",
		})
	}
	return cfg, nil
}
