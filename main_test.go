package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"
)

func TestVersionOf(t *testing.T) {
	engine := []*debug.Module{{Path: "github.com/jackc/pgx/v5", Version: "v5.7.0"}, {Path: benthosModule, Version: "v4.60.0"}}
	vcs := func(rev, modified string) []debug.BuildSetting {
		return []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}
	}
	const rev = "53e47d0c1a2b3c4d5e6f708192a3b4c5d6e7f809"
	cases := []struct {
		name, ldVersion, ldDate string
		bi                      *debug.BuildInfo
		want                    string // the first line of --version
		date                    string
	}{
		{"ldflags win", "v1.2.0", "2025-01-02T03:04:05Z", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Deps: engine, Settings: vcs(rev, "true")},
			"pgrelay v1.2.0 (benthos engine v4.60.0)", "2025-01-02T03:04:05Z"},
		{"plain go build of a clean tree", "", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Deps: engine, Settings: vcs(rev, "false")},
			"pgrelay 53e47d0c1a2b (benthos engine v4.60.0)", "unknown"},
		{"plain go build with changes", "", "", &debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20250101000000-53e47d0c1a2b+dirty"}, Deps: engine, Settings: vcs(rev, "true")},
			"pgrelay 53e47d0c1a2b+dirty (benthos engine v4.60.0)", "unknown"},
		{"go install of a release", "", "", &debug.BuildInfo{Main: debug.Module{Version: "v1.3.0"}, Deps: engine},
			"pgrelay v1.3.0 (benthos engine v4.60.0)", "unknown"},
		{"no build information", "", "", nil, "pgrelay dev (benthos engine unknown)", "unknown"},
		{"replaced engine", "", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"},
			Deps: []*debug.Module{{Path: benthosModule, Version: "v4.60.0", Replace: &debug.Module{Path: "../benthos", Version: "v4.60.1"}}}},
			"pgrelay dev (benthos engine v4.60.1)", "unknown"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var b strings.Builder
			versionOf(c.ldVersion, c.ldDate, c.bi).print(&b)
			if got := b.String(); got != c.want+"\nDate: "+c.date+"\n" {
				t.Fatalf("got %q, want first line %q and date %q", got, c.want, c.date)
			}
		})
	}
}

// TestPlainBuildReportsItsRevision builds the binary with a plain `go build` (no -ldflags) and
// checks that --version names the checked-out revision, with +dirty when the work tree has changes,
// and the Benthos engine compiled in. Go stamps the revision only in a clone (a .git directory; a
// `git worktree` has a .git file, which Go does not follow): there the fallback is "dev".
func TestPlainBuildReportsItsRevision(t *testing.T) {
	git := func(args ...string) string {
		out, err := exec.Command("git", args...).Output()
		if err != nil {
			t.Fatalf("git %s: %v", strings.Join(args, " "), err)
		}
		return strings.TrimSpace(string(out))
	}
	bin := filepath.Join(t.TempDir(), "pgrelay")
	// -buildvcs=true is go build's default (auto) where git is installed; said here so a GOFLAGS
	// that turns it off does not change what is tested.
	if out, err := exec.Command("go", "build", "-buildvcs=true", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	want := "dev"
	if fi, err := os.Stat(".git"); err == nil && fi.IsDir() {
		want = git("rev-parse", "--short=12", "HEAD")
		if git("status", "--porcelain") != "" {
			want += "+dirty"
		}
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		t.Fatalf("--version: %v\n%s", err, out)
	}
	first, _, _ := strings.Cut(string(out), "\n")
	if first != "pgrelay "+want+" (benthos engine v4.60.0)" {
		t.Fatalf("--version printed %q, want the revision %s", out, want)
	}
	if want != "dev" && !regexp.MustCompile(`^[0-9a-f]{12}(\+dirty)?$`).MatchString(want) {
		t.Fatalf("revision %q", want)
	}
}
