// Package cli holds pgrelay's own subcommands, one file each: status, check, resync, snapshot,
// teardown and queue. main lists them where it builds the Benthos CLI. Every subcommand that takes a pipeline
// config (-c) reads it with readPipeline (pipeline.go), which parses each pg_cdc, pg_sink and
// redis_queue section with that plugin's own spec and parser, so a subcommand sees exactly the
// values the running pipeline uses, TLS included.
package cli

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/urfave/cli/v2"
)

// timeout bounds one subcommand's work against the servers.
const timeout = 30 * time.Second

// configFlag is -c, the pipeline config.
func configFlag(usage string) cli.Flag {
	return &cli.StringFlag{Name: "config", Aliases: []string{"c"}, Usage: usage, Required: true}
}

// jsonFlag is --json.
func jsonFlag() cli.Flag { return &cli.BoolFlag{Name: "json", Usage: "print JSON"} }

// quiet makes a command and its subcommands keep go-redis' own log lines (a pool that cannot
// dial logs each attempt) out of their output: the command reports the error itself, once.
func quiet(c *cli.Command) *cli.Command {
	before := c.Before
	c.Before = func(ctx *cli.Context) error {
		redis.SetLogger(discardLogger{})
		if before != nil {
			return before(ctx)
		}
		return nil
	}
	for _, sub := range c.Subcommands {
		quiet(sub)
	}
	return c
}

// discardLogger drops go-redis' log lines.
type discardLogger struct{}

func (discardLogger) Printf(context.Context, string, ...any) {}
