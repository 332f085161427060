package runtime

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestReadReward(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	tests := []struct {
		name    string
		files   map[string]string // name -> content; "->target" makes a symlink, "|fifo" a FIFO
		want    *float64
		rewards map[string]float64
		wantErr string
	}{
		{name: "none"},
		{name: "txt one", files: map[string]string{"reward.txt": "1\n"}, want: f(1)},
		{name: "txt spaces", files: map[string]string{"reward.txt": "  0.25 \n\n"}, want: f(0.25)},
		{name: "txt negative", files: map[string]string{"reward.txt": "-1"}, want: f(-1)},
		{name: "txt empty", files: map[string]string{"reward.txt": ""}, wantErr: `reward.txt: "" is not a number`},
		{name: "txt word", files: map[string]string{"reward.txt": "passed"}, wantErr: `reward.txt: "passed" is not a number`},
		{name: "txt NaN", files: map[string]string{"reward.txt": "NaN"}, wantErr: `reward.txt: "NaN" is not a number`},
		{name: "txt Inf", files: map[string]string{"reward.txt": "+Inf"}, wantErr: `reward.txt: "+Inf" is not a number`},
		{name: "txt two numbers", files: map[string]string{"reward.txt": "1\n0\n"}, wantErr: `reward.txt: "1\n0" is not a number`},
		{name: "txt long garbage is cut", files: map[string]string{"reward.txt": strings.Repeat("x", 100)},
			wantErr: `reward.txt: "` + strings.Repeat("x", 40) + `..." is not a number`},
		// One of the two may have been written through a link the agent
		// left: neither is taken.
		{name: "txt and json", files: map[string]string{"reward.txt": "0", "reward.json": `{"reward": 1}`},
			wantErr: "the verifier wrote both reward.txt and reward.json"},
		{name: "json reward key", files: map[string]string{"reward.json": `{"reward": 0.5, "tests_passed": 3}`},
			want: f(0.5), rewards: map[string]float64{"reward": 0.5, "tests_passed": 3}},
		{name: "json only key", files: map[string]string{"reward.json": `{"accuracy": 0.75}`},
			want: f(0.75), rewards: map[string]float64{"accuracy": 0.75}},
		{name: "json several keys no reward", files: map[string]string{"reward.json": `{"a": 1, "b": 0}`},
			rewards: map[string]float64{"a": 1, "b": 0}},
		{name: "json null reward", files: map[string]string{"reward.json": `{"reward": null}`},
			wantErr: `reward.json: "reward" is null, not a number`},
		{name: "json string reward", files: map[string]string{"reward.json": `{"reward": "1"}`},
			wantErr: `reward.json: "reward" is a string, not a number`},
		{name: "json nested", files: map[string]string{"reward.json": `{"reward": {"x": 1}}`},
			wantErr: `reward.json: "reward" is an object, not a number`},
		{name: "json null", files: map[string]string{"reward.json": `null`},
			wantErr: `reward.json: want an object of numbers, such as {"reward": 1}: got null`},
		{name: "json array", files: map[string]string{"reward.json": `[1]`},
			wantErr: `reward.json: want an object of numbers, such as {"reward": 1}: json: cannot unmarshal array`},
		{name: "json number", files: map[string]string{"reward.json": `1`},
			wantErr: `reward.json: want an object of numbers`},
		{name: "json out of range", files: map[string]string{"reward.json": `{"reward": 1e400}`},
			wantErr: `reward.json: want an object of numbers`},
		{name: "json truncated", files: map[string]string{"reward.json": `{"reward": 1`},
			wantErr: `reward.json: want an object of numbers`},
		{name: "txt symlink not followed", files: map[string]string{"reward.txt": "->/etc/hostname"},
			wantErr: "reading reward.txt: open "},
		{name: "json symlink not followed", files: map[string]string{"reward.json": "->/etc/hostname"},
			wantErr: "reading reward.json: open "},
		{name: "txt fifo", files: map[string]string{"reward.txt": "|fifo"}, wantErr: "reward.txt: not a regular file"},
		{name: "txt directory", files: map[string]string{"reward.txt/": ""}, wantErr: "reward.txt: not a regular file"},
		{name: "txt too large", files: map[string]string{"reward.txt": strings.Repeat("1", maxRewardFile+1)},
			wantErr: "larger than 65536 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, content := range tt.files {
				p := filepath.Join(dir, name)
				var err error
				switch {
				case strings.HasSuffix(name, "/"):
					err = os.Mkdir(p, 0o755)
				case strings.HasPrefix(content, "->"):
					err = os.Symlink(strings.TrimPrefix(content, "->"), p)
				case content == "|fifo":
					err = unix.Mkfifo(p, 0o644)
				default:
					err = os.WriteFile(p, []byte(content), 0o644)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			got, rewards, err := readReward(dir)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("readReward: err %v, want one containing %q", err, tt.wantErr)
				}
				if got != nil || rewards != nil {
					t.Errorf("readReward with an error returned %v, %v", got, rewards)
				}
				return
			}
			if err != nil {
				t.Fatalf("readReward: %v", err)
			}
			if (got == nil) != (tt.want == nil) || (got != nil && *got != *tt.want) {
				t.Errorf("reward = %v, want %v", deref(got), deref(tt.want))
			}
			if !reflect.DeepEqual(rewards, tt.rewards) {
				t.Errorf("rewards = %v, want %v", rewards, tt.rewards)
			}
		})
	}
}

func deref(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}

func FuzzReadReward(f *testing.F) {
	for _, s := range []string{"1", "0.5\n", "", "nan", `{"reward": 1}`, `{"a": 1, "b": 2}`, `{"reward": null}`, `[]`, "\x00"} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, content string, asJSON bool) {
		dir := t.TempDir()
		name := "reward.txt"
		if asJSON {
			name = "reward.json"
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		r, m, err := readReward(dir)
		if err != nil {
			if r != nil || m != nil {
				t.Fatalf("error %v with results %v %v", err, r, m)
			}
			return
		}
		if !asJSON && r == nil {
			t.Fatalf("reward.txt %q read as no reward and no error", content)
		}
		if r != nil && (*r != *r || *r > 1e308 || *r < -1e308) {
			t.Fatalf("reward %v is not a finite number", *r)
		}
	})
}
