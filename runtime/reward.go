package runtime

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

const maxRewardFile = 64 << 10

// readReward reads the verifier's reward from dir: reward.txt (one number)
// or reward.json (an object of numbers; its "reward" key, or its only key,
// is the reward). It returns nil, nil when neither file exists. The files
// are opened without following links.
func readReward(dir string) (*float64, map[string]float64, error) {
	if b, err := readNoFollow(filepath.Join(dir, "reward.txt")); err == nil {
		v, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, nil, fmt.Errorf("reward.txt: %q is not a number", truncateText(string(b)))
		}
		return &v, nil, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, nil, fmt.Errorf("reading reward.txt: %w", err)
	}
	b, err := readNoFollow(filepath.Join(dir, "reward.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("reading reward.json: %w", err)
	}
	var m map[string]float64
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, nil, fmt.Errorf("reward.json: want an object of numbers, such as {\"reward\": 1}: %w", err)
	}
	if v, ok := m["reward"]; ok {
		return &v, m, nil
	}
	if len(m) == 1 {
		for _, v := range m {
			return &v, m, nil
		}
	}
	return nil, m, nil
}

func readNoFollow(path string) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxRewardFile+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxRewardFile {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, maxRewardFile)
	}
	return b, nil
}

func truncateText(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}
