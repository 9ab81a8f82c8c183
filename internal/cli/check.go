package cli

import (
	"context"
	"fmt"
	"io"

	"github.com/urfave/cli/v2"

	"github.com/pgrelay/pgrelay/internal/errcode"
	"github.com/pgrelay/pgrelay/internal/sink"
	"github.com/pgrelay/pgrelay/internal/source"
)

// Check is `pgrelay check -c <config>`.
func Check() *cli.Command {
	return quiet(&cli.Command{
		Name: "check",
		Usage: "Connect to every server a config names and run each pg_cdc, redis_queue and pg_sink component's start " +
			"checks, changing nothing; exit status 1 when one fails (a preflight for CI or a deploy, after `pgrelay lint`)",
		Flags:  []cli.Flag{configFlag("the pipeline config"), jsonFlag()},
		Action: check,
	})
}

// checkResult is one check of one component, as `pgrelay check` prints it.
type checkResult struct {
	Component string       `json:"component"`
	Check     string       `json:"check"`
	OK        bool         `json:"ok"`
	Code      errcode.Code `json:"code,omitempty"`
	Error     string       `json:"error,omitempty"`
}

func check(c *cli.Context) error {
	p, err := readPipeline(c.String("config"))
	if err != nil {
		return cli.Exit(err.Error(), 2)
	}
	if len(p.sources) == 0 && len(p.sinks) == 0 && len(p.queueInputs) == 0 && len(p.queueOutputs) == 0 {
		return cli.Exit("no pg_cdc input, redis_queue input or output, or pg_sink output in "+p.path, 2)
	}
	var results []checkResult
	add := func(component, what string, err error) {
		r := checkResult{Component: component, Check: what, OK: err == nil}
		if err != nil {
			r.Code, r.Error = errcode.Of(err), err.Error()
		}
		results = append(results, r)
	}
	run := func(fn func(ctx context.Context)) {
		ctx, cancel := context.WithTimeout(c.Context, timeout)
		defer cancel()
		fn(ctx)
	}
	for _, cfg := range p.sources {
		run(func(ctx context.Context) {
			for _, f := range source.Preflight(ctx, cfg) {
				add("pg_cdc "+cfg.Name, f.What, f.Err)
			}
		})
	}
	for _, o := range p.queueOutputs {
		what := "redis_queue output"
		if q, ok := o.StaticQueue(); ok {
			what += " (queue " + q + ")"
		}
		run(func(ctx context.Context) {
			add(what, "Redis: the user's commands, the memory policy, the durability settings", o.Check(ctx))
		})
	}
	for _, in := range p.queueInputs {
		run(func(ctx context.Context) {
			add(fmt.Sprintf("redis_queue input (queue %s, group %s)", in.Consumer.Queue, in.Consumer.Group),
				"Redis: the user's commands and keys, the memory policy", in.Check(ctx))
		})
	}
	for _, s := range p.sinks {
		run(func(ctx context.Context) {
			what := "PostgreSQL: the progress table, the target and its privileges"
			if s.Sink.Mode == sink.ModeSQL {
				what = "PostgreSQL: the progress table, the statements"
			}
			creates, err := s.Check(ctx)
			if creates {
				what += " (the progress table " + s.Sink.ProgressTable + " is created at start)"
			}
			add(fmt.Sprintf("pg_sink %s (%s)", s.Sink.Name, s.Sink.Mode), what, err)
		})
	}
	if err := printChecks(c.App.Writer, results, c.Bool("json")); err != nil {
		return err
	}
	for _, r := range results {
		if !r.OK {
			return cli.Exit("", 1)
		}
	}
	return nil
}

// printChecks writes the results as JSON or as text, grouped by component.
func printChecks(w io.Writer, results []checkResult, asJSON bool) error {
	if asJSON {
		return printJSON(w, results)
	}
	last := ""
	for _, r := range results {
		if r.Component != last {
			fmt.Fprintln(w, r.Component)
			last = r.Component
		}
		if r.OK {
			fmt.Fprintf(w, "  ok    %s\n", r.Check)
		} else {
			fmt.Fprintf(w, "  FAIL  %s: %s\n", r.Check, r.Error)
		}
	}
	return nil
}
