package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"
	"github.com/urfave/cli/v2"

	"github.com/pgrelay/pgrelay/internal/follow"
	"github.com/pgrelay/pgrelay/internal/pgconnect"
	"github.com/pgrelay/pgrelay/internal/queue"
	"github.com/pgrelay/pgrelay/internal/redisconn"
)

// connFlags are the connection flags of every queue subcommand.
func connFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "config", Aliases: []string{"c"}, Usage: "take the connection (TLS included) and the queue, when it is a fixed name, from the first redis_queue input (else output) of this pipeline config"},
		&cli.StringFlag{Name: "url", Usage: "Redis URL (redis:// or rediss://)", Value: "redis://127.0.0.1:6379", EnvVars: []string{"REDIS_URL"}},
		&cli.StringSliceFlag{Name: "cluster-url", Usage: "seed node of a Redis Cluster (repeat for several); overrides --url"},
		&cli.StringSliceFlag{Name: "sentinel", Usage: "a Redis Sentinel, host:port (repeat for each); with --sentinel-master the master is the one they name, reached with --url's user, password and TLS"},
		&cli.StringFlag{Name: "sentinel-master", Usage: "the name the sentinels monitor the master under"},
		&cli.StringFlag{Name: "sentinel-password", Usage: "the sentinels' password", EnvVars: []string{"REDIS_SENTINEL_PASSWORD"}},
		&cli.StringFlag{Name: "prefix", Usage: "key prefix", Value: queue.DefaultPrefix},
		&cli.BoolFlag{Name: "json", Usage: "print JSON"},
		&cli.DurationFlag{Name: "timeout", Usage: "give up after this long", Value: 30 * time.Second},
	}
}

// Queue is `pgrelay queue`: inspect a queue (`info`), read where it ends (`position`, the start of
// a group that follows a load) and manage its dead letters (`dlq`, with --replay or --drop),
// human-readable or --json.
func Queue() *cli.Command {
	return quiet(&cli.Command{
		Name:  "queue",
		Usage: "Inspect a pgrelay queue, read its positions and manage its dead letters",
		Description: "E.g. `pgrelay queue info orders --url redis://127.0.0.1:6379 --json` (flags before or after the queue name).\n" +
			"The connection comes from --url (or $REDIS_URL), --cluster-url, or --sentinel with --sentinel-master, with --prefix as in the pipeline config,\n" +
			"or from -c <pipeline config>: its first redis_queue input, else output, TLS included (then the queue name may be left out).",
		Subcommands: []*cli.Command{
			{
				Name:      "info",
				Usage:     "Shards, lengths, groups (lag, pending, owners) and dead letters of a queue",
				ArgsUsage: "<queue>",
				Flags:     connFlags(),
				Action:    func(c *cli.Context) error { return run(c, info) },
			},
			{
				Name:      "position",
				Usage:     "The last entry id of every shard, read at once: where a consumer group that follows a load starts",
				ArgsUsage: "<queue>",
				Flags: append(connFlags(),
					&cli.StringFlag{Name: "pg", Usage: "then wait on this PostgreSQL server (the primary the queue's pg_cdc reads; a DSN) until every transaction at or before the positions is visible to new snapshots: load after that for an exact start (docs/queue.md, Load, then follow)"},
				),
				Action: func(c *cli.Context) error { return run(c, position) },
			},
			{
				Name:      "dlq",
				Usage:     "List a queue's dead letters, or --replay them into the queue, or --drop them",
				ArgsUsage: "<queue>",
				Flags: append(connFlags(),
					&cli.StringFlag{Name: "group", Usage: "only the dead letters of this consumer group"},
					&cli.Int64Flag{Name: "limit", Usage: "at most this many dead letters (0: all)"},
					&cli.BoolFlag{Name: "replay", Usage: "write the dead letters back into the queue and remove them from the dead-letter stream"},
					&cli.BoolFlag{Name: "all-groups", Usage: "with --replay on a queue with several groups: every group sees the replayed messages again"},
					&cli.BoolFlag{Name: "drop", Usage: "delete the dead letters"},
				),
				Action: func(c *cli.Context) error { return run(c, dlq) },
			},
		},
	})
}

// flagConn is the connection the flags give.
func flagConn(c *cli.Context) (redisconn.Config, error) {
	conn := redisconn.Config{URL: c.String("url"), ClusterURLs: c.StringSlice("cluster-url"), Prefix: c.String("prefix")}
	if !c.IsSet("sentinel") && !c.IsSet("sentinel-master") {
		return conn, nil
	}
	conn.Sentinel = &redisconn.Sentinel{MasterName: c.String("sentinel-master"), Addrs: c.StringSlice("sentinel"),
		Password: c.String("sentinel-password")}
	o, err := redis.ParseURL(conn.URL) // the master's user, password and TLS
	if err != nil {
		return conn, redisconn.Config{URL: conn.URL}.Validate()
	}
	conn.Username, conn.Password, conn.TLS = o.Username, o.Password, o.TLSConfig
	return conn, nil
}

// env is what a subcommand works with.
type env struct {
	c      *cli.Context
	rdb    redis.UniversalClient
	layout queue.Layout
	queue  string
	out    io.Writer
}

// queueUsage says what is wrong with a queue subcommand's arguments (the binary moves flags written
// after the queue name before it: FlagsFirst).
func queueUsage(cmd string, args []string) string {
	usage := fmt.Sprintf("usage: pgrelay queue %s [flags] <queue>", cmd)
	if len(args) > 1 {
		return fmt.Sprintf("one queue name only, got %d arguments (%s)", len(args), usage)
	}
	return usage
}

func run(c *cli.Context, fn func(context.Context, *env) error) error {
	conn, err := flagConn(c)
	if err != nil {
		return cli.Exit(err.Error(), 2)
	}
	name := c.Args().First()
	if path := c.String("config"); path != "" {
		fromFile, q, err := queueFromConfig(path)
		if err != nil {
			return cli.Exit(err.Error(), 2)
		}
		conn = fromFile
		if c.IsSet("prefix") {
			conn.Prefix = c.String("prefix")
		}
		if name == "" {
			name = q
		}
	}
	if name == "" || c.NArg() > 1 {
		return cli.Exit(queueUsage(c.Command.Name, c.Args().Slice()), 2)
	}
	if err := conn.Validate(); err != nil {
		return cli.Exit(err.Error(), 2)
	}
	rdb, err := conn.Client()
	if err != nil {
		return cli.Exit(err.Error(), 2)
	}
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), c.Duration("timeout"))
	defer cancel()
	out := c.App.Writer
	if out == nil {
		out = os.Stdout
	}
	if err := conn.CheckACL(ctx, rdb, name, queueUses(c)...); err != nil {
		return cli.Exit(err.Error(), 1)
	}
	e := &env{c: c, rdb: rdb, layout: queue.NewLayout(conn.Prefix), queue: name, out: out}
	if err := fn(ctx, e); err != nil {
		return cli.Exit(conn.Explain(err).Error(), 1)
	}
	return nil
}

// queueUses are what a queue subcommand does in Redis, for its ACL check.
func queueUses(c *cli.Context) []redisconn.Use {
	switch {
	case c.Command.Name == "info":
		return []redisconn.Use{redisconn.UseInspect}
	case c.Command.Name == "position":
		return []redisconn.Use{redisconn.UsePosition}
	case c.Bool("replay"):
		return []redisconn.Use{redisconn.UseDeadLetters, redisconn.UseReplay}
	case c.Bool("drop"):
		return []redisconn.Use{redisconn.UseDeadLetters, redisconn.UseDrop}
	}
	return []redisconn.Use{redisconn.UseDeadLetters}
}

// queueFromConfig is the connection of the pipeline's first redis_queue input, else output, and
// its queue when that is one fixed name.
func queueFromConfig(path string) (redisconn.Config, string, error) {
	p, err := readPipeline(path)
	if err != nil {
		return redisconn.Config{}, "", err
	}
	if len(p.queueInputs) > 0 {
		in := p.queueInputs[0]
		return in.Conn, in.Consumer.Queue, nil
	}
	if len(p.queueOutputs) > 0 {
		out := p.queueOutputs[0]
		q, _ := out.StaticQueue()
		return out.Conn, q, nil
	}
	return redisconn.Config{}, "", fmt.Errorf("%s: no redis_queue input or output", path)
}

func info(ctx context.Context, e *env) error {
	in, err := queue.Inspect(ctx, e.rdb, e.layout, e.queue)
	if err != nil {
		return err
	}
	if e.c.Bool("json") {
		return printJSON(e.out, in)
	}
	fmt.Fprintf(e.out, "queue %s: %d shards, %d messages kept, %d dead letters (layout version %s)\n\n",
		in.Queue, in.Shards, in.Length, in.DeadLetters, in.Version)
	tw := tabwriter.NewWriter(e.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SHARD\tLENGTH\tFIRST OFFSET\tLAST OFFSET")
	for _, s := range in.ShardInfo {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\n", s.Shard, s.Length, s.FirstOffset, s.LastOffset)
	}
	tw.Flush()
	if len(in.Groups) == 0 {
		fmt.Fprintln(e.out, "\nno consumer groups")
		return nil
	}
	for _, g := range in.Groups {
		fmt.Fprintf(e.out, "\ngroup %s: lag %d, pending %d, %d live replicas\n", g.Name, g.Lag, g.Pending, g.Replicas)
		tw := tabwriter.NewWriter(e.out, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "SHARD\tLAG\tPENDING\tOWNER")
		for _, s := range g.Shards {
			owner := s.Owner
			if owner == "" {
				owner = "-"
			}
			fmt.Fprintf(tw, "%d\t%d\t%d\t%s\n", s.Shard, s.Lag, s.Pending, owner)
		}
		tw.Flush()
	}
	return nil
}

// positionReport is what `pgrelay queue position --json` prints.
type positionReport struct {
	Queue     string           `json:"queue"`
	Shards    int              `json:"shards"`
	Positions string           `json:"positions"` // "id,id,...": the start's positions
	Shard     []queue.Position `json:"shard_positions"`
	Waited    bool             `json:"waited"` // --pg: the transactions at or before the positions are visible now
}

func position(ctx context.Context, e *env) error {
	ps, err := queue.ReadPositions(ctx, e.rdb, e.layout, e.queue)
	if err != nil {
		return err
	}
	rep := positionReport{Queue: e.queue, Shards: len(ps), Positions: queue.PositionsText(ps), Shard: ps}
	if dsn := e.c.String("pg"); dsn != "" {
		if err := waitCommitted(ctx, dsn, e.c.App.ErrWriter); err != nil {
			return err
		}
		rep.Waited = true
	}
	if e.c.Bool("json") {
		return printJSON(e.out, rep)
	}
	fmt.Fprintf(e.out, "queue %s: %d shards\n\n", rep.Queue, rep.Shards)
	tw := tabwriter.NewWriter(e.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SHARD\tLAST ID\tENTRIES ADDED")
	for _, p := range ps {
		fmt.Fprintf(tw, "%d\t%s\t%d\n", p.Shard, p.ID, p.Added)
	}
	tw.Flush()
	fmt.Fprintf(e.out, "\npositions: %s\n", rep.Positions)
	if rep.Waited {
		fmt.Fprintln(e.out, "every transaction at or before these positions is now visible to new snapshots: load now")
	}
	return nil
}

// waitCommitted connects to dsn and waits there until every transaction that may have committed
// is visible (follow.WaitCommitted), reporting on w what it waits for.
func waitCommitted(ctx context.Context, dsn string, w io.Writer) error {
	cfg, err := pgconnect.Config{DSN: dsn, ApplicationName: "pgrelay queue position"}.ConnConfig()
	if err != nil {
		return fmt.Errorf("--pg: %w", err)
	}
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("--pg: %w", pgconnect.Explain(err))
	}
	defer conn.Close(context.Background())
	if w == nil {
		w = os.Stderr
	}
	return follow.WaitCommitted(ctx, conn, func(xids []string) {
		fmt.Fprintf(w, "waiting for the transactions in progress to end (xids %s)\n", strings.Join(xids, ", "))
	})
}

func dlq(ctx context.Context, e *env) error {
	replay, drop := e.c.Bool("replay"), e.c.Bool("drop")
	if replay && drop {
		return fmt.Errorf("choose one of --replay and --drop")
	}
	dls, err := queue.ListDeadLetters(ctx, e.rdb, e.layout, e.queue, e.c.String("group"), e.c.Int64("limit"))
	if err != nil {
		return err
	}
	switch {
	case replay:
		n, err := queue.ReplayDeadLetters(ctx, e.rdb, e.layout, e.queue, dls, e.c.Bool("all-groups"))
		if err != nil {
			return err
		}
		return report(e, "replayed", int64(n))
	case drop:
		n, err := queue.DropDeadLetters(ctx, e.rdb, e.layout, e.queue, dls)
		if err != nil {
			return err
		}
		return report(e, "dropped", n)
	}
	if e.c.Bool("json") {
		if dls == nil {
			dls = []queue.DeadLetter{}
		}
		return printJSON(e.out, dls)
	}
	fmt.Fprintf(e.out, "queue %s: %d dead letters\n", e.queue, len(dls))
	for _, d := range dls {
		fmt.Fprintf(e.out, "\n%s  group %s  partition %s  offset %d  message %s  attempts %d  failed %s\n  error: %s\n  payload: %s\n",
			d.EntryID, d.Group, d.Partition, d.Offset, d.MessageID, d.Attempts,
			time.UnixMilli(d.FailedAt).UTC().Format(time.RFC3339), d.Error, abbreviate(d.Payload, 200))
	}
	return nil
}

func report(e *env, what string, n int64) error {
	if e.c.Bool("json") {
		return printJSON(e.out, map[string]any{"queue": e.queue, what: n})
	}
	fmt.Fprintf(e.out, "queue %s: %s %d dead letters\n", e.queue, what, n)
	return nil
}

func abbreviate(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
