package cli

import (
	"context"

	"github.com/urfave/cli/v2"

	"github.com/pgrelay/pgrelay/internal/source"
)

// Teardown is `pgrelay teardown -c <config>`.
func Teardown() *cli.Command {
	return quiet(&cli.Command{
		Name:  "teardown",
		Usage: "Drop a pg_cdc source's slot and managed publication and delete its pointer (stop pgrelay first)",
		Flags: []cli.Flag{configFlag("the pipeline config holding the pg_cdc input"),
			&cli.BoolFlag{Name: "force", Usage: "even while a replica holds the lease"}},
		Action: func(c *cli.Context) error {
			return onSources(c, func(ctx context.Context, cfg source.Config) error {
				return source.Teardown(ctx, cfg, c.Bool("force"), c.App.Writer)
			})
		},
	})
}
