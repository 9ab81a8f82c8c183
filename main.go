// Command pgrelay is a custom Benthos distribution that moves PostgreSQL changes through a Redis
// Streams queue and back into PostgreSQL, exactly once. It is the Benthos CLI (run, lint, echo, ...)
// with pgrelay's plugins compiled in and pgrelay's own subcommands (status, resync, teardown, queue).
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime/debug"

	_ "github.com/redpanda-data/benthos/v4/public/components/io"
	_ "github.com/redpanda-data/benthos/v4/public/components/pure"
	"github.com/redpanda-data/benthos/v4/public/service"
	ucli "github.com/urfave/cli/v2"

	_ "github.com/pgrelay/pgrelay/input"
	"github.com/pgrelay/pgrelay/internal/cli"
	"github.com/pgrelay/pgrelay/internal/gctune"
	_ "github.com/pgrelay/pgrelay/internal/metrics"
	"github.com/pgrelay/pgrelay/internal/proctune"
	_ "github.com/pgrelay/pgrelay/output"
)

// Version is pgrelay's version, set at build time with -ldflags "-X main.Version=...". A plain
// `go build` or `go install` leaves it empty, and the build's own information names the version.
var Version = ""

// DateBuilt is the build date, set at build time like Version.
var DateBuilt = ""

func main() {
	b := buildVersion(Version, DateBuilt)
	if len(os.Args) == 2 && isVersionFlag(os.Args[1]) {
		b.print(os.Stdout)
		return
	}
	opts := []service.CLIOptFunc{
		service.CLIOptSetBinaryName("pgrelay"),
		service.CLIOptSetProductName("pgrelay"),
		service.CLIOptSetVersion(b.String(), b.date),
		service.CLIOptSetDocumentationURL("https://github.com/pgrelay/pgrelay/tree/main/docs"),
	}
	// pgrelay's own subcommands, next to Benthos' run, lint, echo, streams, list...
	cmds := []*ucli.Command{cli.Status(), cli.Check(), cli.Resync(), cli.Snapshot(), cli.Teardown(), cli.Queue()}
	for _, c := range cmds {
		opts = append(opts, service.CLIOptAddCommand(c))
	}
	// ...whose flags may also follow their arguments (pgrelay queue info orders --url …)
	opts = append(opts, service.CLIOptSetArgs(cli.FlagsFirst(cmds, os.Args)...))
	// The collector's goal: the live heap plus a headroom, unless GOGC or GOMEMLIMIT says otherwise.
	if gctune.Enabled() {
		gctune.Start(gctune.Headroom)
	}
	// One Go processor while pgrelay's work fits in a core, Go's default once it needs more, unless
	// GOMAXPROCS says otherwise.
	if proctune.Enabled() {
		proctune.Start()
	}
	// Benthos handles SIGINT/SIGTERM itself; cancelling this context would skip the graceful stop.
	service.RunCLI(context.Background(), opts...)
}

// benthosModule is the module path of the engine.
const benthosModule = "github.com/redpanda-data/benthos/v4"

// version is what `pgrelay --version` reports.
type version struct {
	pgrelay, engine, date string
}

// String is "<pgrelay version> (benthos engine <engine version>)".
func (v version) String() string {
	return fmt.Sprintf("%s (benthos engine %s)", v.pgrelay, v.engine)
}

// print writes the version: `pgrelay <version> (benthos engine <version>)`, then the build date.
func (v version) print(w io.Writer) {
	fmt.Fprintf(w, "pgrelay %s\nDate: %s\n", v, v.date)
}

// isVersionFlag reports whether arg is the CLI's version flag (urfave/cli accepts one or two dashes).
func isVersionFlag(arg string) bool {
	switch arg {
	case "--version", "-version", "-v", "--v":
		return true
	}
	return false
}

// buildVersion names this build from the -ldflags values, else from the build information Go
// embeds.
func buildVersion(ldVersion, ldDate string) version {
	bi, _ := debug.ReadBuildInfo()
	return versionOf(ldVersion, ldDate, bi)
}

// versionOf names a build: pgrelay's version is ldVersion when set at build time; else the VCS
// revision Go stamped (the first 12 hex digits, +dirty when the work tree had changes); else the
// module's version (`go install ...@v1.2.3`); else "dev". The engine's is the Benthos module's.
func versionOf(ldVersion, ldDate string, bi *debug.BuildInfo) version {
	v := version{pgrelay: ldVersion, engine: "unknown", date: ldDate}
	if bi == nil {
		bi = &debug.BuildInfo{}
	}
	var revision string
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	for _, m := range bi.Deps {
		if m.Path == benthosModule {
			v.engine = m.Version
			if m.Replace != nil && m.Replace.Version != "" {
				v.engine = m.Replace.Version
			}
		}
	}
	switch {
	case v.pgrelay != "":
	case revision != "":
		v.pgrelay = revision[:min(12, len(revision))]
		if dirty {
			v.pgrelay += "+dirty"
		}
	case bi.Main.Version != "" && bi.Main.Version != "(devel)":
		v.pgrelay = bi.Main.Version
	default:
		v.pgrelay = "dev"
	}
	if v.date == "" {
		v.date = "unknown"
	}
	return v
}
