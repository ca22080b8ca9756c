// Package private keeps a daemon's files to the user it runs as: data
// directories are created with mode 0700, log files are opened 0600 without
// following symbolic links, and group or world access found on what should be
// private is removed with a log line, so that a tree created by an older
// version, by an installer or by hand is tightened at the next start.
package private

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// DirMode and FileMode are the modes of private directories and files.
const (
	DirMode  fs.FileMode = 0o700
	FileMode fs.FileMode = 0o600
)

// loose are the permission bits a private file or directory must not have.
const loose fs.FileMode = 0o077

// MkdirAll creates dir and any missing parents with mode 0700 (as
// os.MkdirAll) and removes group and world access from dir itself (the
// directory a symbolic link dir names, if it is one) if it already existed
// with them, logging the change. Parents that existed are left as they are:
// they may be shared, such as /var/lib.
func MkdirAll(dir string, log *slog.Logger) error {
	if err := os.MkdirAll(dir, DirMode); err != nil {
		return fmt.Errorf("create private directory: %w", err)
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return fmt.Errorf("private directory: %w", err)
	}
	_, err = Tighten(real, log)
	return err
}

// Tighten removes group and world permission bits from path and reports
// whether it changed anything; a change is logged with the old and new mode.
// A symbolic link at path is left alone (a link's own mode means nothing,
// and its target may be anyone's): the file is opened without following one
// and changed through that descriptor, so a link swapped in meanwhile is not
// followed either.
func Tighten(path string, log *slog.Logger) (bool, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENXIO) {
		return false, nil // a symbolic link, or a socket: nothing to read there
	}
	if err != nil {
		return false, fmt.Errorf("tighten mode of %s: %w", path, &os.PathError{Op: "open", Path: path, Err: err})
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return false, fmt.Errorf("tighten mode of %s: %w", path, err)
	}
	old := fs.FileMode(st.Mode & 0o777)
	if old&loose == 0 {
		return false, nil
	}
	perm := old &^ loose
	if err := unix.Fchmod(fd, uint32(perm)|st.Mode&0o7000); err != nil {
		return false, fmt.Errorf("tighten mode of %s: %w", path, err)
	}
	if log != nil {
		log.Warn("removed group and world access", "path", path, "old_mode", fmt.Sprintf("%#o", old),
			"new_mode", fmt.Sprintf("%#o", perm))
	}
	return true, nil
}

// TightenTree applies Tighten to root and everything below it and returns how
// many entries it changed; only a summary is logged, not each entry.
func TightenTree(root string, log *slog.Logger) (int, error) {
	n := 0
	if real, err := filepath.EvalSymlinks(root); err == nil {
		root = real // a data directory given as a link: its target
	}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		changed, err := Tighten(path, nil)
		if changed {
			n++
		}
		return err
	})
	if n > 0 && log != nil {
		log.Warn("removed group and world access below a private directory", "dir", root, "entries", n)
	}
	if err != nil {
		return n, fmt.Errorf("tighten modes below %s: %w", root, err)
	}
	return n, nil
}

// ErrExposed is returned by CheckSecret for a secret file that users other
// than its owner may read or write.
var ErrExposed = errors.New("secret file is accessible by group or others")

// CheckSecret returns an error wrapping ErrExposed when the file at path (a
// symbolic link is followed) grants its group or others any access, as ssh
// refuses such private keys, with the chmod that fixes it.
func CheckSecret(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("check secret file: %w", err)
	}
	if perm := fi.Mode().Perm(); perm&loose != 0 {
		return fmt.Errorf("%w: %s has mode %#o; run `chmod 600 %s`", ErrExposed, path, perm, path)
	}
	return nil
}

// OpenLog opens (creating with mode 0600, appending) the log file at path
// without following a symbolic link at its last component, so that a link
// planted where the log should be cannot make a process running as root write
// elsewhere; it refuses a file that is not regular, not ours or has other
// links. An existing file open to others is tightened first.
func OpenLog(path string) (*os.File, error) {
	// O_NONBLOCK: a FIFO planted there must not block the open.
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CREAT|unix.O_APPEND|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, uint32(FileMode))
	if err != nil {
		return nil, fmt.Errorf("open log file %s: %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("open log file %s: %w", path, err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		unix.Close(fd)
		return nil, fmt.Errorf("open log file %s: not a regular file", path)
	case int(st.Uid) != os.Geteuid() || st.Nlink != 1:
		// Another user's file (made to read our log) or a hard link to
		// a file elsewhere.
		unix.Close(fd)
		return nil, fmt.Errorf("open log file %s: owned by uid %d with %d links, want ours with 1", path, st.Uid, st.Nlink)
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("open log file %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open log file %s: %w", path, err)
	}
	if fi.Mode().Perm()&loose != 0 {
		if err := f.Chmod(fi.Mode().Perm() &^ loose); err != nil {
			f.Close()
			return nil, fmt.Errorf("open log file %s: %w", path, err)
		}
	}
	return f, nil
}
