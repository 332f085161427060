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
// is the reward). It returns nil, nil when neither file exists, and an
// error when both do: which one counts would be a guess, and one of them
// may have been written through a link the agent planted. The files are
// opened without following links.
func readReward(dir string) (*float64, map[string]float64, error) {
	_, errTxt := os.Lstat(filepath.Join(dir, "reward.txt"))
	_, errJSON := os.Lstat(filepath.Join(dir, "reward.json"))
	if errTxt == nil && errJSON == nil {
		return nil, nil, errors.New("the verifier wrote both reward.txt and reward.json; a verifier writes one")
	}
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
	m, err := parseRewardJSON(b)
	if err != nil {
		return nil, nil, err
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

// parseRewardJSON reads an object of numbers. A null or any other
// non-number value is refused: decoding straight into float64 would read
// {"reward": null} as a reward of 0.
func parseRewardJSON(b []byte) (map[string]float64, error) {
	var raw map[string]any
	if err := json.Unmarshal(b, &raw); err != nil || raw == nil {
		if err == nil {
			err = errors.New("got null")
		}
		return nil, fmt.Errorf("reward.json: want an object of numbers, such as {\"reward\": 1}: %w", err)
	}
	m := make(map[string]float64, len(raw))
	for k, v := range raw {
		f, ok := v.(float64)
		if !ok {
			return nil, fmt.Errorf("reward.json: %q is %s, not a number", truncateText(k), jsonKind(v))
		}
		m[k] = f
	}
	return m, nil
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case []any:
		return "an array"
	}
	return "an object"
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
