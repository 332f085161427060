package runtime

import (
	"os"
	"path/filepath"
	"strings"
)

// What a trial hides from the sandbox: the folders that hold the answer
// or other trials, wherever they resolve, and the git object stores
// around the task.

// hiddenPaths are host paths masked inside the sandbox: the task folder
// (its oracle and verifier hold the answer) and the .git folder of a
// repository it lies in (whose objects hold the same), the jobs folder,
// the invoking user's home, and whatever the caller adds. Each is hidden
// by the path given and by the path it resolves to, so that a folder named
// through a symlink is hidden where the sandbox can reach it.
func hiddenPaths(spec TrialSpec) []string {
	var out []string
	add := func(p string) {
		if p == "" {
			return
		}
		abs, err := filepath.Abs(p)
		if err != nil {
			return
		}
		out = append(out, abs)
		if real, err := filepath.EvalSymlinks(abs); err == nil && real != abs {
			out = append(out, real)
		}
	}
	add(spec.TaskDir)
	if real, err := filepath.EvalSymlinks(spec.TaskDir); err == nil {
		for _, g := range enclosingGitDirs(real) {
			add(g)
		}
	}
	add(spec.JobsDir)
	add(os.Getenv("HOME"))
	if u := os.Getenv("SUDO_USER"); u != "" && !strings.ContainsAny(u, "/.") {
		add(filepath.Join("/home", u))
	}
	for _, p := range spec.Hide {
		add(p)
	}
	return out
}

// enclosingGitDirs returns where the nearest repository above dir (an
// absolute path without symlinks) keeps its objects: its .git; when .git
// is a file (a worktree, a submodule, --separate-git-dir) the folder its
// "gitdir:" line names and that folder's "commondir"; the repositories
// its remotes name by a local path; and the object stores their
// objects/info/alternates name (a clone made with --shared or
// --reference), followed a few levels. Nil when there is no repository.
func enclosingGitDirs(dir string) []string {
	for d := filepath.Dir(dir); ; d = filepath.Dir(d) {
		g := filepath.Join(d, ".git")
		fi, err := os.Lstat(g)
		if err == nil {
			out := []string{g}
			if fi.Mode().IsRegular() {
				out = append(out, gitDirOf(d, g)...)
			}
			out = append(out, localRemotes(out)...)
			return append(out, alternates(out)...)
		}
		if d == "/" || d == "." {
			return nil
		}
	}
}

// localRemotes returns the repositories the git folders' config names as
// remotes by a local path or a file:// URL (a clone of a mirror under
// /opt): their objects hold the task as well. Relative paths are taken
// from the work tree above the git folder, as git does.
func localRemotes(gitDirs []string) []string {
	var out []string
	for _, g := range gitDirs {
		b, err := os.ReadFile(filepath.Join(g, "config"))
		if err != nil || len(b) > 1<<20 {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(strings.TrimSpace(line), "=")
			if !ok || !strings.EqualFold(strings.TrimSpace(k), "url") {
				continue // git's config keys are case-insensitive
			}
			v = strings.Trim(strings.TrimSpace(v), `"`)
			v = strings.TrimPrefix(strings.TrimPrefix(v, "file://localhost"), "file://")
			switch {
			case filepath.IsAbs(v):
			case strings.Contains(v, "://") || strings.Contains(v, "@") || strings.Contains(v, ":") || v == "":
				continue // a remote host
			default:
				v = filepath.Join(filepath.Dir(g), v)
			}
			out = append(out, filepath.Clean(v))
			if len(out) == 16 {
				return out
			}
		}
	}
	return out
}

// alternates returns the object stores that the git folders' (and, in
// turn, those stores') objects/info/alternates name, at most 16.
func alternates(gitDirs []string) []string {
	var out []string
	queue := make([]string, 0, len(gitDirs))
	for _, g := range gitDirs {
		queue = append(queue, filepath.Join(g, "objects"))
	}
	seen := map[string]bool{}
	for len(queue) > 0 && len(out) < 16 {
		objects := queue[0]
		queue = queue[1:]
		b, err := os.ReadFile(filepath.Join(objects, "info", "alternates"))
		if err != nil || len(b) > 64<<10 {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			if !filepath.IsAbs(line) {
				line = filepath.Join(objects, line)
			}
			line = filepath.Clean(line)
			if !seen[line] && len(out) < 16 {
				seen[line] = true
				out = append(out, line)
				queue = append(queue, line)
			}
		}
	}
	return out
}

// gitDirOf follows a .git file (in work tree wt) to the git folder it
// names, and that folder's commondir.
func gitDirOf(wt, file string) []string {
	b, err := os.ReadFile(file)
	if err != nil || len(b) > 4096 {
		return nil
	}
	p, ok := strings.CutPrefix(strings.TrimSpace(string(b)), "gitdir:")
	if !ok {
		return nil
	}
	p = strings.TrimSpace(p)
	if !filepath.IsAbs(p) {
		p = filepath.Join(wt, p)
	}
	out := []string{filepath.Clean(p)}
	if c, err := os.ReadFile(filepath.Join(p, "commondir")); err == nil && len(c) <= 4096 {
		common := strings.TrimSpace(string(c))
		if !filepath.IsAbs(common) {
			common = filepath.Join(p, common)
		}
		out = append(out, filepath.Clean(common))
	}
	return out
}
