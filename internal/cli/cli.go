// Package cli holds pgrelay's own subcommands (status, resync, teardown, queue), added to the
// Benthos CLI by main. Each subcommand registers itself here from the package that implements it,
// so main stays a list of imports.
package cli

import (
	"sort"
	"sync"

	"github.com/urfave/cli/v2"
)

var (
	mu       sync.Mutex
	commands = map[string]*cli.Command{}
)

// Register adds a subcommand; it panics on a duplicate name, a programming error caught at start.
func Register(c *cli.Command) {
	mu.Lock()
	defer mu.Unlock()
	if _, dup := commands[c.Name]; dup {
		panic("cli: duplicate command " + c.Name)
	}
	commands[c.Name] = c
}

// Commands lists the registered subcommands by name.
func Commands() []*cli.Command {
	mu.Lock()
	defer mu.Unlock()
	out := make([]*cli.Command, 0, len(commands))
	for _, c := range commands {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
