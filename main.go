// Command pgrelay is a custom Benthos distribution that moves PostgreSQL changes through a Redis
// Streams queue and back into PostgreSQL, exactly once. It is the Benthos CLI (run, lint, echo, ...)
// with pgrelay's plugins compiled in and pgrelay's own subcommands (status, resync, teardown, queue).
package main

import (
	"context"
	"fmt"
	"runtime/debug"

	_ "github.com/redpanda-data/benthos/v4/public/components/io"
	_ "github.com/redpanda-data/benthos/v4/public/components/pure"
	"github.com/redpanda-data/benthos/v4/public/service"

	_ "github.com/pgrelay/pgrelay/input"
	"github.com/pgrelay/pgrelay/internal/cli"
	_ "github.com/pgrelay/pgrelay/internal/metrics"
	_ "github.com/pgrelay/pgrelay/output"
)

// Version is pgrelay's version, set at build time with -ldflags "-X main.Version=...".
var Version = "dev"

// DateBuilt is the build date, set at build time like Version.
var DateBuilt = "unknown"

func main() {
	opts := []service.CLIOptFunc{
		service.CLIOptSetBinaryName("pgrelay"),
		service.CLIOptSetProductName("pgrelay"),
		service.CLIOptSetVersion(fmt.Sprintf("%s (benthos engine %s)", Version, engineVersion()), DateBuilt),
		service.CLIOptSetDocumentationURL("https://github.com/pgrelay/pgrelay/tree/main/docs"),
	}
	for _, c := range cli.Commands() {
		opts = append(opts, service.CLIOptAddCommand(c))
	}
	// Benthos handles SIGINT/SIGTERM itself; cancelling this context would skip the graceful stop.
	service.RunCLI(context.Background(), opts...)
}

// engineVersion is the version of the Benthos module compiled in.
func engineVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			if m.Path == "github.com/redpanda-data/benthos/v4" {
				return m.Version
			}
		}
	}
	return "unknown"
}
