// Package sdnotify tells systemd about a service's life, for units of
// Type=notify: ready, stopping, and the watchdog's keep-alives. Every call
// is a no-op when the process was not started by systemd with a
// notification socket ($NOTIFY_SOCKET).
package sdnotify

import (
	"context"
	"log/slog"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
)

// Ready tells systemd that the service serves: a unit ordered after it may
// start. Failures are logged: they do not stop the service.
func Ready(log *slog.Logger) { send(log, daemon.SdNotifyReady) }

// Stopping tells systemd that the service is shutting down.
func Stopping(log *slog.Logger) { send(log, daemon.SdNotifyStopping) }

func send(log *slog.Logger, state string) {
	if _, err := daemon.SdNotify(false, state); err != nil {
		log.Warn("sd_notify", "state", state, "err", err)
	}
}

// Watchdog, when the unit sets WatchdogSec, sends systemd a keep-alive at
// half that interval for as long as ctx lasts and alive reports no error;
// a service that stops answering is then restarted by systemd. It returns
// at once (the keep-alives run in their own goroutine).
func Watchdog(ctx context.Context, log *slog.Logger, alive func(context.Context) error) {
	every, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		log.Warn("sd_notify: watchdog", "err", err)
		return
	}
	if every <= 0 {
		return
	}
	every /= 2
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			cctx, cancel := context.WithTimeout(ctx, every)
			err := alive(cctx)
			cancel()
			if err != nil {
				log.Warn("sd_notify: watchdog: not alive, no keep-alive sent", "err", err)
				continue
			}
			send(log, daemon.SdNotifyWatchdog)
		}
	}()
}
