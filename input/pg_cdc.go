package input

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	"github.com/redpanda-data/benthos/v4/public/service"

	"github.com/pgrelay/pgrelay/internal/queue"
	"github.com/pgrelay/pgrelay/internal/source"
)

func init() {
	service.MustRegisterBatchInput("pg_cdc", source.Spec(), newPgCDC)
}

func newPgCDC(conf *service.ParsedConfig, mgr *service.Resources) (service.BatchInput, error) {
	cfg, err := source.ParseConfig(conf)
	if err != nil {
		return nil, err
	}
	src, err := source.New(cfg, mgr.Logger(), hooks(mgr, cfg.Name))
	if err != nil {
		return nil, err
	}
	return &pgCDC{src: src}, nil
}

// sourcePhases are the phases pgrelay_source_phase reports, one series each (docs/metrics.md).
var sourcePhases = []string{source.PhaseConnecting, source.PhaseStandby, source.PhaseWaitingForSlot,
	source.PhaseSnapshot, source.PhaseStreaming, source.PhaseError, source.PhaseStopped}

// hooks turns the source's events into metrics, each labelled with the source's name.
func hooks(mgr *service.Resources, name string) source.Hooks {
	m := mgr.Metrics()
	txns := m.NewCounter("pgrelay_source_transactions", "source")
	lag := m.NewGauge("pgrelay_source_slot_lag_bytes", "source")
	msgs := m.NewCounter("pgrelay_source_messages", "source")
	bundles := m.NewCounter("pgrelay_source_bundles", "source")
	ptr := m.NewGauge("pgrelay_source_pointer_lsn", "source")
	owner := m.NewGauge("pgrelay_source_owner", "source")
	errs := m.NewCounter("pgrelay_source_errors", "source", "code")
	snapRows := m.NewCounter("pgrelay_source_snapshot_rows", "source")
	snapTables := m.NewCounter("pgrelay_source_snapshot_tables", "source")
	phase := m.NewGauge("pgrelay_source_phase", "source", "phase")
	return source.Hooks{
		Transactions: func(n int64) { txns.Incr(n, name) },
		SlotLag:      func(n int64) { lag.Set(n, name) },
		Messages:     func(n int64) { msgs.Incr(n, name) },
		Bundles:      func(n int64) { bundles.Incr(n, name) },
		PointerLSN:   func(lsn uint64) { ptr.Set(int64(lsn), name) },
		Owner: func(o bool) {
			if o {
				owner.Set(1, name)
			} else {
				owner.Set(0, name)
			}
		},
		Error: func(code string) {
			if code == "" {
				code = "transient"
			}
			errs.Incr(1, name, code)
		},
		Phase: func(p string) {
			for _, q := range sourcePhases {
				if q == p {
					phase.Set(1, name, q)
				} else {
					phase.Set(0, name, q)
				}
			}
		},
		SnapshotRows:   func(n int64) { snapRows.Incr(n, name) },
		SnapshotTables: func(n int64) { snapTables.Incr(n, name) },
	}
}

// pgCDC is the Benthos shell over source.Source.
type pgCDC struct {
	src  *source.Source
	once sync.Once
}

func (p *pgCDC) Connect(ctx context.Context) error {
	p.once.Do(p.src.Start)
	return nil
}

func (p *pgCDC) ReadBatch(ctx context.Context) (service.MessageBatch, service.AckFunc, error) {
	b, err := p.src.Next(ctx, prepareMessages)
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		return nil, nil, err
	}
	batch, ok := b.Out.(service.MessageBatch)
	b.Out = nil // a re-send after a nack gets fresh messages
	if !ok {
		batch = toMessages(b)
	}
	return batch, func(ctx context.Context, err error) error {
		return p.src.Ack(ctx, b, err)
	}, nil
}

// prepareMessages converts a batch Next built ahead, while the previous batch is in flight.
func prepareMessages(b *source.Batch) { b.Out = toMessages(b) }

// perMessageKeys are the metadata keys that may differ between the messages of a batch.
var perMessageKeys = [...]string{"queue", "partition", "message_id", "transaction_id", "op", "table", "lsn", "xid", "created_at"}

// toMessages turns a source batch into Benthos messages (docs/batch-contract.md). The batch-wide
// metadata is set once on a template; each message is a copy of it, so its metadata map is
// allocated once at its final size, and values repeated from the previous message (queue,
// transaction, op, table, lsn...) reuse its boxed value instead of allocating one each.
func toMessages(b *source.Batch) service.MessageBatch {
	tmpl := service.NewMessage(nil)
	for _, k := range perMessageKeys {
		tmpl.MetaSetMut(k, "")
	}
	tmpl.MetaSetMut("pgrelay_lease_key", b.LeaseKey)
	tmpl.MetaSetMut("pgrelay_fence", b.Fence)
	tmpl.MetaSetMut("pgrelay_pointer_key", b.PointerKey)
	tmpl.MetaSetMut("pgrelay_cover", string(b.CoverJSON))
	tmpl.MetaSetMut(queue.MetaCoverReceipt, b.Receipt())
	batch := make(service.MessageBatch, len(b.Events))
	var queueV, txV, opV, tableV, lsnV repeated
	var xid, created any
	for i := range b.Events {
		e := &b.Events[i]
		if i == 0 || e.Xid != b.Events[i-1].Xid {
			xid = strconv.FormatUint(uint64(e.Xid), 10)
		}
		if i == 0 || e.CreatedMs != b.Events[i-1].CreatedMs {
			created = strconv.FormatInt(e.CreatedMs, 10)
		}
		m := tmpl.Copy()
		m.SetBytes(e.Payload)
		m.MetaSetMut("queue", queueV.box(e.Queue))
		m.MetaSetMut("partition", e.Partition)
		m.MetaSetMut("message_id", e.ID)
		m.MetaSetMut("transaction_id", txV.box(e.Tx))
		m.MetaSetMut("op", opV.box(e.Op))
		m.MetaSetMut("table", tableV.box(e.Table))
		m.MetaSetMut("lsn", lsnV.box(e.LSN))
		m.MetaSetMut("xid", xid)
		m.MetaSetMut("created_at", created)
		batch[i] = m
	}
	return batch
}

// repeated boxes a string as a metadata value once for a run of equal values.
type repeated struct {
	s   string
	v   any
	set bool
}

func (r *repeated) box(s string) any {
	if !r.set || s != r.s {
		r.s, r.v, r.set = s, s, true
	}
	return r.v
}

func (p *pgCDC) Close(ctx context.Context) error {
	if err := p.src.Close(ctx); err != nil {
		return fmt.Errorf("pg_cdc close: %w", err)
	}
	return nil
}
