package localpg

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
)

// osUser is the account the server runs as. cred is nil when jetgres is not root: the server
// then runs as the current user, which PostgreSQL accepts.
type osUser struct {
	name string
	uid  uint32
	gid  uint32
	gids []uint32 // primary and supplementary groups
	cred *syscall.Credential
}

// resolveUser picks the account for the server. PostgreSQL refuses to run as root, so as root
// we need an unprivileged account; the distribution's "postgres" user is the natural one.
func resolveUser(name string) (osUser, error) {
	if os.Geteuid() != 0 {
		cur, err := user.Current()
		if err != nil {
			return osUser{}, fmt.Errorf("looking up the current user: %w", err)
		}
		if name != "" && name != cur.Username {
			return osUser{}, fmt.Errorf("Config.User %q: running the server as another user needs root; jetgres runs as %q", name, cur.Username)
		}
		return lookupUser(cur)
	}
	if name == "" {
		name = "nobody"
		if _, err := user.Lookup("postgres"); err == nil {
			name = "postgres"
		}
	}
	u, err := user.Lookup(name)
	if err != nil {
		return osUser{}, fmt.Errorf("Config.User %q: %w", name, err)
	}
	ou, err := lookupUser(u)
	if err != nil {
		return osUser{}, err
	}
	if ou.uid == 0 {
		return osUser{}, fmt.Errorf("Config.User %q is root: PostgreSQL refuses to run as root", name)
	}
	ou.cred = &syscall.Credential{Uid: ou.uid, Gid: ou.gid, Groups: ou.gids}
	return ou, nil
}

func lookupUser(u *user.User) (osUser, error) {
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return osUser{}, fmt.Errorf("user %q has a non-numeric uid %q", u.Username, u.Uid)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return osUser{}, fmt.Errorf("user %q has a non-numeric gid %q", u.Username, u.Gid)
	}
	ou := osUser{name: u.Username, uid: uint32(uid), gid: uint32(gid), gids: []uint32{uint32(gid)}}
	ids, err := u.GroupIds()
	if err != nil {
		return osUser{}, fmt.Errorf("listing the groups of user %q: %w", u.Username, err)
	}
	for _, id := range ids {
		g, err := strconv.ParseUint(id, 10, 32)
		if err == nil && !slices.Contains(ou.gids, uint32(g)) {
			ou.gids = append(ou.gids, uint32(g))
		}
	}
	return ou, nil
}

// AccessError is returned by Start when the OS user the server runs as cannot enter a directory
// above the data directory: a data directory under root's home (mode 0700) when jetgres runs as
// root, for instance.
type AccessError struct {
	User string      // the OS user the server runs as
	Dir  string      // the directory it cannot enter
	Mode fs.FileMode // Dir's permission bits
	UID  uint32      // Dir's owner
	GID  uint32      // Dir's group
}

func (e *AccessError) Error() string {
	return fmt.Sprintf("the PostgreSQL server runs as OS user %q, which cannot enter %s (mode %04o, owner uid %d, group gid %d): "+
		"choose a data directory outside %s, or make it traversable (chmod o+x %s)", e.User, e.Dir, e.Mode, e.UID, e.GID, e.Dir, e.Dir)
}

// checkTraversable fails with an *AccessError if the server's user cannot reach dir through
// its ancestors, because PostgreSQL would fail later with a bare "permission denied" that does
// not say which directory is at fault. Ancestors that do not exist yet are skipped: Start
// creates them traversable. It reads mode bits only; an ACL granting access is not seen.
func (u osUser) checkTraversable(dir string) error {
	if u.cred == nil {
		return nil
	}
	for d := filepath.Dir(dir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return fmt.Errorf("checking access to %s: %w", d, err)
		default:
			st, ok := fi.Sys().(*syscall.Stat_t)
			if ok && !u.canEnter(fi.Mode().Perm(), st.Uid, st.Gid) {
				return &AccessError{User: u.name, Dir: d, Mode: fi.Mode().Perm(), UID: st.Uid, GID: st.Gid}
			}
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}

func (u osUser) canEnter(perm fs.FileMode, uid, gid uint32) bool {
	switch {
	case uid == u.uid:
		return perm&0o100 != 0
	case slices.Contains(u.gids, gid):
		return perm&0o010 != 0
	default:
		return perm&0o001 != 0
	}
}

// chownTree gives the server's user everything under dir. It only touches entries owned by
// someone else, so on an existing cluster it is a cheap walk.
func (u osUser) chownTree(dir string) error {
	if u.cred == nil {
		return nil
	}
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		fi, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid == u.uid && st.Gid == u.gid {
			return nil
		}
		if err := os.Lchown(path, int(u.uid), int(u.gid)); err != nil {
			return fmt.Errorf("giving %s to user %q: %w", path, u.name, err)
		}
		return nil
	})
}
