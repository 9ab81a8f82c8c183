package sinkstatus

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

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
		fmt.Fprintf(w, "  queue %s: %d shards, %d messages applied (the sum of their offsets), last commit %s\n",
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
