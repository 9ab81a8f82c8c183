package cli

import (
	"context"
	"fmt"
	"slices"

	"github.com/urfave/cli/v2"

	"github.com/pgrelay/pgrelay/internal/source"
)

// Snapshot is `pgrelay snapshot -c <config> <table>...`.
func Snapshot() *cli.Command {
	return quiet(&cli.Command{
		Name:      "snapshot",
		Usage:     "Ask the pg_cdc source streaming the named tables to read them again while it streams (their rows go to the queue as r events; no new epoch)",
		ArgsUsage: "<schema.table>...",
		Flags:     []cli.Flag{configFlag("the pipeline config holding the pg_cdc input")},
		Action: func(c *cli.Context) error {
			p, err := readPipeline(c.String("config"))
			if err != nil {
				return cli.Exit(err.Error(), 2)
			}
			if len(p.sources) == 0 {
				return cli.Exit("no pg_cdc input in "+p.path, 2)
			}
			if c.NArg() == 0 {
				return cli.Exit("name the tables to read again: pgrelay snapshot -c "+p.path+" <schema.table>...", 2)
			}
			asked := map[string][]string{} // source → the named tables it streams
			for _, t := range c.Args().Slice() {
				schema, name := source.ParseTable(t)
				full := source.Table{Schema: schema, Name: name}.Full()
				found := false
				for _, cfg := range p.sources {
					if slices.ContainsFunc(cfg.Tables, func(ct source.Table) bool { return ct.Names(full) }) {
						asked[cfg.Name], found = append(asked[cfg.Name], full), true
					}
				}
				if !found {
					return cli.Exit(fmt.Sprintf("no pg_cdc input of %s streams %s", p.path, full), 2)
				}
			}
			return forEachSource(c.Context, p, func(ctx context.Context, cfg source.Config) error {
				if len(asked[cfg.Name]) == 0 {
					return nil
				}
				return source.RequestReread(ctx, cfg, asked[cfg.Name], c.App.Writer)
			})
		},
	})
}
