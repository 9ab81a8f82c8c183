package cli

import (
	"slices"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"
)

// TestFlagsFirst: flags written after a subcommand's arguments are moved before them, with their
// values; boolean flags take none; `--` ends the flags; Benthos' own commands are left alone.
func TestFlagsFirst(t *testing.T) {
	cmds := []*cli.Command{Status(), Check(), Resync(), Snapshot(), Teardown(), Queue()}
	for _, c := range []struct{ in, want string }{
		{"pgrelay queue info orders --url redis://h:1 --json", "pgrelay queue info --url redis://h:1 --json orders"},
		{"pgrelay queue info --url redis://h:1 orders", "pgrelay queue info --url redis://h:1 orders"},
		{"pgrelay queue dlq orders --json --group g --replay", "pgrelay queue dlq --json --group g --replay orders"},
		{"pgrelay queue position orders --url=redis://h:1 --timeout 5s", "pgrelay queue position --url=redis://h:1 --timeout 5s orders"},
		{"pgrelay queue info orders --sentinel a:1 --sentinel b:2 --sentinel-master m", "pgrelay queue info --sentinel a:1 --sentinel b:2 --sentinel-master m orders"},
		{"pgrelay queue info a b --json", "pgrelay queue info --json a b"},
		{"pgrelay queue info orders -- --json", "pgrelay queue info orders -- --json"},
		{"pgrelay status --json -c p.yaml", "pgrelay status --json -c p.yaml"},
		{"pgrelay queue info orders -h", "pgrelay queue info -h orders"},
		{"pgrelay lint a.yaml --deprecated", "pgrelay lint a.yaml --deprecated"},
		{"pgrelay -c a.yaml", "pgrelay -c a.yaml"},
		{"pgrelay", "pgrelay"},
	} {
		if got := strings.Join(FlagsFirst(cmds, strings.Fields(c.in)), " "); got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.in, got, c.want)
		}
	}
	args := strings.Fields("pgrelay queue info orders --json")
	orig := slices.Clone(args)
	FlagsFirst(cmds, args)
	if !slices.Equal(args, orig) {
		t.Errorf("FlagsFirst changed its argument: %v", args)
	}
}
