package cli

import (
	"slices"
	"strings"

	"github.com/urfave/cli/v2"
)

// FlagsFirst returns args (os.Args) with the flags of one of cmds written after its arguments
// moved before them: the flag parser stops at the first argument, so `pgrelay queue info orders
// --url …` would leave --url unread. Arguments keep their order, a flag keeps its value, and
// everything after `--` stays as it is. Args naming none of cmds (Benthos' own commands) come back
// unchanged.
func FlagsFirst(cmds []*cli.Command, args []string) []string {
	if len(args) < 2 {
		return args
	}
	cmd := find(cmds, args[1])
	if cmd == nil {
		return args
	}
	i := 2
	for i < len(args) {
		sub := find(cmd.Subcommands, args[i])
		if sub == nil {
			break
		}
		cmd, i = sub, i+1
	}
	var flags, rest []string
	for j := i; j < len(args); j++ {
		a := args[j]
		switch {
		case a == "--":
			rest = append(rest, args[j:]...)
			j = len(args)
		case len(a) > 1 && strings.HasPrefix(a, "-"):
			flags = append(flags, a)
			if takesValue(cmd, a) && j+1 < len(args) {
				j++
				flags = append(flags, args[j])
			}
		default:
			rest = append(rest, a)
		}
	}
	return slices.Concat(args[:i], flags, rest)
}

// find returns the command of cmds named (or aliased) name.
func find(cmds []*cli.Command, name string) *cli.Command {
	for _, c := range cmds {
		if c.HasName(name) {
			return c
		}
	}
	return nil
}

// takesValue reports whether the flag arg (-x, --x; not --x=v) of cmd reads the next argument as
// its value: every flag but a boolean one (and help).
func takesValue(cmd *cli.Command, arg string) bool {
	name := strings.TrimLeft(arg, "-")
	if strings.Contains(name, "=") {
		return false
	}
	for _, f := range cmd.Flags {
		if slices.Contains(f.Names(), name) {
			_, boolean := f.(*cli.BoolFlag)
			return !boolean
		}
	}
	return false // unknown (help, or a mistake the parser will name)
}
