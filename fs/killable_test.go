package fs

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

func TestDyingStatus(t *testing.T) {
	const head = "Name:\tdd\nUmask:\t0022\n"
	tests := []struct {
		name, status string
		want         bool
	}{
		{"running, nothing pending", head + "State:\tS (sleeping)\nSigPnd:\t0000000000000000\nShdPnd:\t0000000000000000\n", false},
		{"SIGURG pending (Go preemption)", head + "State:\tS (sleeping)\nSigPnd:\t0000000000000000\nShdPnd:\t0000000000000800\n", false},
		{"SIGINT pending", head + "State:\tS (sleeping)\nSigPnd:\t0000000000000002\nShdPnd:\t0000000000000000\n", false},
		{"SIGKILL pending on the thread", head + "State:\tD (disk sleep)\nSigPnd:\t0000000000000100\nShdPnd:\t0000000000000000\n", true},
		{"SIGKILL pending on the process", head + "State:\tD (disk sleep)\nSigPnd:\t0000000000000000\nShdPnd:\t0000000000000100\n", true},
		{"zombie", head + "State:\tZ (zombie)\nSigPnd:\t0000000000000000\n", true},
	}
	for _, tt := range tests {
		if got := dyingStatus(tt.status); got != tt.want {
			t.Errorf("%s: dying = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestDying reads a real process's status: alive while it sleeps, dying once
// it is killed and until it is reaped (a zombie), and gone afterwards.
func TestDying(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Skip("no sleep command:", err)
	}
	pid := uint32(cmd.Process.Pid)
	if dying(pid) {
		t.Fatal("a sleeping process is dying")
	}
	cmd.Process.Signal(syscall.SIGKILL)
	deadline := time.Now().Add(10 * time.Second)
	for !dying(pid) {
		if time.Now().After(deadline) {
			t.Fatal("a killed process is not dying after 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cmd.Wait()
	if !dying(pid) {
		t.Fatal("a reaped process is not dying")
	}
	if dying(uint32(os.Getpid())) {
		t.Fatal("this test's own process is dying")
	}
}
