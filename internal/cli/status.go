package cli

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/pgrelay/pgrelay/internal/sinkstatus"
	"github.com/pgrelay/pgrelay/internal/source"
)

// Status is `pgrelay status -c <config>`.
func Status() *cli.Command {
	return quiet(&cli.Command{
		Name: "status",
		Usage: "Show each pg_cdc source of a config (owner, phases, pointer, slot and lag), then each pg_sink and " +
			"redis_queue input (applied offsets per shard, group lag, pending, dead letters)",
		Flags:  []cli.Flag{configFlag("the pipeline config"), jsonFlag()},
		Action: status,
	})
}

func status(c *cli.Context) error {
	p, err := readPipeline(c.String("config"))
	if err != nil {
		return cli.Exit(err.Error(), 2)
	}
	if len(p.sources) == 0 && len(p.sinks) == 0 && len(p.queueInputs) == 0 {
		return cli.Exit("no pg_cdc input, pg_sink output or redis_queue input in "+p.path, 2)
	}
	w, asJSON := c.App.Writer, c.Bool("json")
	if err := forEachSource(c.Context, p, func(ctx context.Context, cfg source.Config) error {
		st, err := source.ReadStatus(ctx, cfg)
		if err != nil {
			return err
		}
		return printSource(w, st, asJSON)
	}); err != nil {
		return err
	}
	parts := sinkParts(p)
	if len(parts.Sinks) == 0 && len(parts.Groups) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(c.Context, timeout)
	defer cancel()
	st := sinkstatus.Read(ctx, parts)
	if err := sinkstatus.Print(w, st, asJSON); err != nil {
		return err
	}
	if problems := st.Problems(); len(problems) > 0 {
		return cli.Exit(strings.Join(problems, "\n"), 1)
	}
	return nil
}

// sinkParts are the pipeline's pg_sink outputs and redis_queue inputs, as sinkstatus reads them.
func sinkParts(p *pipeline) sinkstatus.Parts {
	parts := sinkstatus.Parts{MetricsURL: p.metricsURL}
	for _, s := range p.sinks {
		conn := s.Conn
		conn.ApplicationName = "pgrelay-status"
		parts.Sinks = append(parts.Sinks, sinkstatus.SinkRef{Name: s.Sink.Name, Table: s.Sink.Into(),
			Mode: string(s.Sink.Mode), ProgressTable: s.Sink.ProgressTable, Conn: conn})
	}
	for _, q := range p.queueInputs {
		parts.Groups = append(parts.Groups, sinkstatus.GroupRef{Queue: q.Consumer.Queue, Group: q.Consumer.Group, Redis: q.Conn})
	}
	return parts
}

// forEachSource runs fn for every pg_cdc input of the pipeline; the first error ends the command
// with exit status 1, naming the source.
func forEachSource(ctx context.Context, p *pipeline, fn func(context.Context, source.Config) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for _, cfg := range p.sources {
		if err := fn(ctx, cfg); err != nil {
			return cli.Exit(fmt.Sprintf("%s: %v", cfg.Name, cfg.Redis.Explain(err)), 1)
		}
	}
	return nil
}

// printSource writes one source's status as indented JSON or as text.
func printSource(w io.Writer, st *source.Status, asJSON bool) error {
	if asJSON {
		return printJSON(w, st)
	}
	fmt.Fprintf(w, "source %s\n", st.Name)
	if st.Owner == "" {
		fmt.Fprintln(w, "  owner:       none")
	} else {
		fmt.Fprintf(w, "  owner:       %s (lease %.1fs left)\n", st.Owner, float64(st.LeaseTTLLeftMs)/1000)
	}
	reps := make([]string, 0, len(st.Replicas))
	for k := range st.Replicas {
		reps = append(reps, k)
	}
	sort.Strings(reps)
	for _, k := range reps {
		fmt.Fprintf(w, "  replica:     %s %s\n", k, st.Replicas[k])
	}
	if st.Phase != "" {
		phase := st.Phase
		if st.ErrorCode != "" {
			phase += " (" + string(st.ErrorCode) + ")"
		}
		fmt.Fprintf(w, "  phase:       %s\n", phase)
	}
	if st.LSN == "" {
		fmt.Fprintf(w, "  pointer:     %s\n", orNone(string(st.Pointer)))
	} else {
		inTxn := ""
		if st.InTransaction {
			inTxn = ", inside the next transaction"
		}
		fmt.Fprintf(w, "  pointer:     lsn %s%s, epoch %s, generation %d, updated %s\n", st.LSN, inTxn, st.Epoch, st.Generation, st.PointerUpdatedAt)
	}
	if st.LagBytes != nil {
		fmt.Fprintf(w, "  lag:         %d bytes of WAL not yet in the queue\n", *st.LagBytes)
	}
	for _, r := range st.RefusedTables {
		fmt.Fprintf(w, "  refused:     %s: %s\n", r.Table, r.Error)
	}
	if r := st.Reread; r != nil {
		state := "pending: the owner reads them within heartbeat/2, or at its next start"
		if r.Applied {
			state = "taken by a start (the snapshot line shows the reading)"
		}
		fmt.Fprintf(w, "  re-read:     %s, requested %s by %s, %s\n", strings.Join(r.Tables, ", "), r.RequestedAt, r.By, state)
	}
	if st.SlotUnread {
		fmt.Fprintf(w, "  slot:        %s not read (PostgreSQL: below)\n", st.Slot)
	} else {
		fmt.Fprintf(w, "  slot:        %s exists=%v active_pid=%d confirmed_flush=%s wal_status=%s lag_bytes=%d\n",
			st.Slot, st.SlotExists, st.SlotActivePID, orNone(st.ConfirmedFlush), orNone(st.WALStatus), st.SlotLagBytes)
	}
	if st.InsertPublication != "" {
		fmt.Fprintf(w, "  publication: %s, %s (append-only tables: insert, truncate)\n", st.Publication, st.InsertPublication)
	} else {
		fmt.Fprintf(w, "  publication: %s\n", st.Publication)
	}
	if st.Snapshot != nil {
		fmt.Fprintf(w, "  snapshot:    %s\n", strings.TrimPrefix(st.Snapshot.String(), "snapshot of "))
	}
	if st.PostgresProblem != "" {
		fmt.Fprintf(w, "  postgres:    %s\n", st.PostgresProblem)
	}
	return nil
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
