package cli

import (
	"context"

	"github.com/urfave/cli/v2"

	"github.com/pgrelay/pgrelay/internal/source"
)

// Resync is `pgrelay resync -c <config>`.
func Resync() *cli.Command {
	return quiet(&cli.Command{
		Name: "resync",
		Usage: "Ask the pg_cdc sources of a config to start over: new slot, new epoch, full snapshot " +
			"(the fix for slot_lost, slot_invalidated, system_changed, slot_ahead)",
		Flags: []cli.Flag{configFlag("the pipeline config holding the pg_cdc input")},
		Action: func(c *cli.Context) error {
			return onSources(c, func(ctx context.Context, cfg source.Config) error {
				return source.RequestResync(ctx, cfg, c.App.Writer)
			})
		},
	})
}

// onSources reads the config and runs fn for each of its pg_cdc inputs; a config without one is a
// usage error.
func onSources(c *cli.Context, fn func(context.Context, source.Config) error) error {
	p, err := readPipeline(c.String("config"))
	if err != nil {
		return cli.Exit(err.Error(), 2)
	}
	if len(p.sources) == 0 {
		return cli.Exit("no pg_cdc input in "+p.path, 2)
	}
	return forEachSource(c.Context, p, fn)
}
