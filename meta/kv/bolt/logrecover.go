package bolt

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	bbolt "go.etcd.io/bbolt"
)

// RecoverOptions tunes RecoverLog.
type RecoverOptions struct {
	// DryRun makes RecoverLog report what it would do and write nothing.
	DryRun bool
}

// LogRecovery is what RecoverLog found and did.
type LogRecovery struct {
	// Applied is the last sequence number the database held before.
	Applied uint64
	// Damage is the damage in the middle of the log, lowest sequence
	// number first (what Open refused); a torn tail is not listed.
	Damage []LogDamage
	// Replayed is the records applied to the database.
	Replayed LSNRange
	// Dropped is the acknowledged records dropped: the database lacks
	// them and the log cannot give them in order (from the first damaged
	// or missing one up to the highest intact one).
	Dropped LSNRange
}

// RecoverLog cuts the log of the store in dir at the damage in its middle:
// the explicit step an operator takes after Open refused the store with a
// *CorruptLogError. In one commit it replays into the database every intact
// record after the last applied one, in order, up to the first sequence
// number the log cannot give (a damaged or missing record), and stores a new
// epoch of the log, which makes every record of the old log stale: that is
// the cut. The records from the first missing one up to the highest intact
// one are dropped and reported; a damaged record that the database already
// holds costs nothing. The log files are left as they are (new records
// overwrite them). On an intact log RecoverLog does what Open and Close do.
//
// No store may be open on dir: the database is locked while the meta server
// runs, and RecoverLog fails after 2 seconds. It does not create a store: dir
// must hold a database. With DryRun it writes nothing.
func RecoverLog(dir string, opts RecoverOptions) (*LogRecovery, error) {
	path := filepath.Join(dir, FileName)
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("bolt: recover the log: no database: %w", err)
	}
	db, err := openDB(path, 0, opts.DryRun)
	if err != nil {
		return nil, fmt.Errorf("%w (is the meta server still running?)", err)
	}
	rep, err := recoverLog(db, dir, opts)
	if cerr := db.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("bolt: close %s: %w", path, cerr)
	}
	if err != nil {
		return nil, err
	}
	return rep, nil
}

// recoverLog is RecoverLog on the open database.
func recoverLog(db *bbolt.DB, dir string, opts RecoverOptions) (*LogRecovery, error) {
	st, err := readLogState(db)
	if err != nil {
		return nil, err
	}
	rep := &LogRecovery{Applied: st.applied}
	if st.epoch == 0 {
		return rep, nil // nothing was ever logged
	}
	l, err := readLog(dir, st.epoch)
	if err != nil {
		return nil, err
	}
	plan := l.plan(st.applied)
	rep.Damage, rep.Dropped = l.damage(), plan.dropped
	if n := len(plan.replay); n > 0 {
		rep.Replayed = LSNRange{First: plan.replay[0].lsn, Last: plan.replay[n-1].lsn}
	}
	if opts.DryRun {
		return rep, nil
	}
	if _, err := replay(db, st.applied, plan.replay); err != nil {
		return nil, err
	}
	return rep, nil
}

// readLog reads the segments in dir (a missing one is empty) and scans them
// for the records of epoch.
func readLog(dir string, epoch uint64) (*logScan, error) {
	var data [2][]byte
	var names [2]string
	for i, name := range []string{LogFile0, LogFile1} {
		names[i] = filepath.Join(dir, name)
		b, err := os.ReadFile(names[i])
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("bolt: read log: %w", err)
		}
		data[i] = b
	}
	return scanLog(names, data, epoch), nil
}
