package runtime

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"flowgate/gate"
)

// progress reports a trial as it goes: one line per phase, with its
// elapsed time, or one JSON event per line with --json.
type progress struct {
	mu   sync.Mutex
	w    io.Writer
	json bool
}

func newProgress(w io.Writer, asJSON bool) *progress {
	if w == nil {
		w = io.Discard
	}
	return &progress{w: w, json: asJSON}
}

type phaseRun struct {
	name    string
	started time.Time
}

// event is one --json line.
type event struct {
	Event   string   `json:"event"`
	Time    string   `json:"time"`
	Task    string   `json:"task,omitempty"`
	Trial   string   `json:"trial,omitempty"`
	Mode    string   `json:"network_mode,omitempty"`
	Phase   string   `json:"phase,omitempty"`
	Elapsed *float64 `json:"elapsed_sec,omitempty"`
	Exit    *int     `json:"exit_code,omitempty"`
	Timeout bool     `json:"timed_out,omitempty"`
	Reward  *float64 `json:"reward,omitempty"`
	Error   *string  `json:"error,omitempty"`
}

func (p *progress) emit(e event, text string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.json {
		e.Time = time.Now().UTC().Format(time.RFC3339Nano)
		b, _ := json.Marshal(e)
		p.w.Write(append(b, '\n'))
		return
	}
	if text != "" {
		io.WriteString(p.w, text+"\n")
	}
}

func (p *progress) start(task, dir string, mode gate.Mode) {
	p.emit(event{Event: "trial_start", Task: task, Trial: dir, Mode: mode.String()},
		fmt.Sprintf("trial     %s  (%s, network_mode %s)", task, dir, mode))
}

func (p *progress) phase(name string) *phaseRun {
	p.emit(event{Event: "phase_start", Phase: name}, "")
	return &phaseRun{name: name, started: time.Now()}
}

func (p *progress) end(ph *phaseRun, info phaseInfo) {
	secs := info.DurationSec
	status := "done"
	if info.TimedOut {
		status = "timed out"
	} else if info.ExitCode != nil && *info.ExitCode != 0 {
		status = "exit " + strconv.Itoa(*info.ExitCode)
	}
	p.emit(event{Event: "phase_end", Phase: ph.name, Elapsed: &secs, Exit: info.ExitCode, Timeout: info.TimedOut},
		fmt.Sprintf("%-9s %-10s %7.1fs", ph.name, status, secs))
}

func (p *progress) reward(r *float64) {
	if r == nil {
		return
	}
	p.emit(event{Event: "reward", Reward: r}, fmt.Sprintf("reward    %g", *r))
}

func (p *progress) finish(res trialResult, dir string) {
	text := "result    " + dir
	if res.Error != nil {
		text = fmt.Sprintf("failed    %s\nresult    %s", *res.Error, dir)
	}
	p.emit(event{Event: "trial_end", Trial: dir, Reward: res.Reward, Error: res.Error}, text)
}
