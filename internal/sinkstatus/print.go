package sinkstatus

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"
)

// WithSinks wraps the status command's action (the source part): for a config holding a pg_cdc
// input the source part runs first; then every pg_sink output and redis_queue input of the config
// is shown. A config with neither a source nor a sink part is an error naming what is looked for.
func WithSinks(sources cli.ActionFunc) cli.ActionFunc {
	return func(c *cli.Context) error {
		path := c.String("config")
		parts, err := PartsFromFile(path)
		if err != nil {
			return cli.Exit(err.Error(), 2)
		}
		if len(parts.Sinks) == 0 && len(parts.Groups) == 0 {
			return sources(c) // only a source, or nothing: the source part says so
		}
		if parts.HasSource {
			if err := sources(c); err != nil {
				return err
			}
		}
		ctx, cancel := context.WithTimeout(c.Context, 30*time.Second)
		defer cancel()
		st := Read(ctx, parts)
		if err := Print(c.App.Writer, st, c.Bool("json")); err != nil {
			return err
		}
		if p := st.Problems(); len(p) > 0 {
			return cli.Exit(strings.Join(p, "\n"), 1)
		}
		return nil
	}
}

// Print writes the status as indented JSON or as text.
func Print(w io.Writer, st *Status, asJSON bool) error {
	if asJSON {
		b, err := json.MarshalIndent(st, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(w, string(b))
		return err
	}
	for _, s := range st.Sinks {
		printSink(w, s)
	}
	for _, g := range st.Groups {
		printGroup(w, g)
	}
	return nil
}

func printSink(w io.Writer, s SinkStatus) {
	target := s.Table
	if target == "" {
		target = "its statement"
	}
	fmt.Fprintf(w, "sink %s (mode %s into %s; progress in %s)\n", s.Name, s.Mode, target, s.ProgressTable)
	if s.Problem != "" {
		fmt.Fprintf(w, "  error: %s\n", s.Problem)
	}
	if len(s.Progress) == 0 && s.Problem == "" {
		fmt.Fprintln(w, "  no progress rows yet: nothing applied")
	}
	byQueue := map[string][]ShardProgress{}
	var queues []string
	for _, p := range s.Progress {
		if byQueue[p.Queue] == nil {
			queues = append(queues, p.Queue)
		}
		byQueue[p.Queue] = append(byQueue[p.Queue], p)
	}
	if s.Live != nil {
		fmt.Fprintf(w, "  %s\n", s.Live.liveLine())
	}
	for _, q := range queues {
		var sum int64
		var last time.Time
		for _, p := range byQueue[q] {
			sum += p.LastOffset
			if p.UpdatedAt.After(last) {
				last = p.UpdatedAt
			}
		}
		fmt.Fprintf(w, "  queue %s: %d shards, %d entries applied (the sum of their offsets), last commit %s\n",
			q, len(byQueue[q]), sum, last.Format(time.RFC3339))
	}
}

func printGroup(w io.Writer, g GroupStatus) {
	fmt.Fprintf(w, "group %s on queue %s", g.Group, g.Queue)
	if g.info == nil {
		fmt.Fprintf(w, "\n  error: %s\n", g.Problem)
		return
	}
	fmt.Fprintf(w, ": %d shards, lag %d, pending %d, dead letters %d, live replicas %d\n",
		g.Shards, g.Lag, g.Pending, g.DeadLetters, g.Replicas)
	if g.Problem != "" {
		fmt.Fprintf(w, "  error: %s\n", g.Problem)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  shard\tlast_offset\tapplied\tbehind\tlag\tpending\towner")
	for _, s := range g.ShardInfo {
		applied, behind := "-", "-"
		if s.Applied != nil {
			applied, behind = fmt.Sprint(*s.Applied), fmt.Sprint(*s.Behind)
		}
		owner := s.Owner
		if owner == "" {
			owner = "-"
		}
		fmt.Fprintf(tw, "  %d\t%d\t%s\t%s\t%d\t%d\t%s\n", s.Shard, s.LastOffset, applied, behind, s.Lag, s.Pending, owner)
	}
	tw.Flush()
}
