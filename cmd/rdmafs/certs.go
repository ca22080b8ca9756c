package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/rdmafs/rdmafs/meta/auth"
)

// newCertsCommand is `rdmafs certs DIR`: a CA and certificates for TLS on
// the control plane.
func newCertsCommand() *cobra.Command {
	var hosts string
	var validity time.Duration
	cmd := &cobra.Command{
		Use:   "certs DIR",
		Short: "Make a CA and TLS certificates for meta and its clients",
		Long: "Create DIR (mode 0700) with a certificate authority (ca.pem, ca-key.pem), a certificate\n" +
			"for the meta servers valid for --hosts (meta.pem, meta-key.pem) and a client certificate\n" +
			"(client.pem, client-key.pem). Keys are written 0600; nothing is overwritten.\n\n" +
			"Give meta --tls-cert meta.pem --tls-key meta-key.pem --tls-ca ca.pem (and\n" +
			"--tls-require-client-cert for mutual TLS); give mounts, chunkd and admin commands\n" +
			"--tls-ca ca.pem --tls-cert client.pem --tls-key client-key.pem. Keep ca-key.pem offline.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var list []string
			for _, h := range strings.Split(hosts, ",") {
				if h = strings.TrimSpace(h); h != "" {
					list = append(list, h)
				}
			}
			if validity <= 0 {
				return fmt.Errorf("--validity %v: must be positive", validity)
			}
			c, err := auth.GenerateCerts(args[0], list, time.Now(), validity)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "meta:    --tls-cert %s --tls-key %s --tls-ca %s\n", c.ServerCert, c.ServerKey, c.CA)
			fmt.Fprintf(w, "clients: --tls-ca %s --tls-cert %s --tls-key %s\n", c.CA, c.ClientCert, c.ClientKey)
			fmt.Fprintf(w, "valid for %s until %s; keep %s offline\n", strings.Join(list, ", "),
				time.Now().Add(validity).Format(time.DateOnly), c.CAKey)
			return nil
		},
	}
	cmd.Flags().StringVar(&hosts, "hosts", "127.0.0.1,localhost", "comma-separated names and IP addresses clients dial meta at")
	cmd.Flags().DurationVar(&validity, "validity", 3*365*24*time.Hour, "how long the certificates are valid")
	return cmd
}
