// Package fiorun runs fio job files and reads their JSON results.
package fiorun

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// Result is one reporting group of a fio run.
type Result struct {
	Name      string
	ReadBW    float64 // bytes per second
	ReadIOPS  float64
	WriteBW   float64
	WriteIOPS float64
	Errors    int
}

type report struct {
	Jobs []struct {
		Jobname string `json:"jobname"`
		Error   int    `json:"error"`
		Read    side   `json:"read"`
		Write   side   `json:"write"`
	} `json:"jobs"`
}

type side struct {
	BWBytes float64 `json:"bw_bytes"`
	IOPS    float64 `json:"iops"`
}

// Run runs fio on jobFile with env (KEY=VALUE) added to the environment and
// returns a result per reporting group, in job order.
func Run(ctx context.Context, jobFile string, env ...string) ([]Result, error) {
	cmd := exec.CommandContext(ctx, "fio", "--output-format=json", jobFile)
	cmd.Env = append(os.Environ(), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("fio %s: %v: %s", jobFile, err, stderr.String())
	}
	// fio may print notices before the JSON document.
	if i := strings.IndexByte(string(out), '{'); i > 0 {
		out = out[i:]
	}
	var r report
	if err := json.Unmarshal(out, &r); err != nil {
		return nil, fmt.Errorf("fio %s: reading its JSON: %w", jobFile, err)
	}
	var res []Result
	for _, j := range r.Jobs {
		res = append(res, Result{Name: j.Jobname, ReadBW: j.Read.BWBytes, ReadIOPS: j.Read.IOPS,
			WriteBW: j.Write.BWBytes, WriteIOPS: j.Write.IOPS, Errors: j.Error})
		if j.Error != 0 {
			return res, fmt.Errorf("fio job %s failed with error %d", j.Jobname, j.Error)
		}
	}
	return res, nil
}
