package input

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	"github.com/redpanda-data/benthos/v4/public/service"

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
	src, err := source.New(cfg, mgr.Logger(), hooks(mgr))
	if err != nil {
		return nil, err
	}
	return &pgCDC{src: src}, nil
}

func hooks(mgr *service.Resources) source.Hooks {
	m := mgr.Metrics()
	txns := m.NewCounter("pgrelay_source_transactions")
	lag := m.NewGauge("pgrelay_source_slot_lag_bytes")
	msgs := m.NewCounter("pgrelay_source_messages")
	bundles := m.NewCounter("pgrelay_source_bundles")
	ptr := m.NewGauge("pgrelay_source_pointer_lsn")
	owner := m.NewGauge("pgrelay_source_owner")
	errs := m.NewCounter("pgrelay_source_errors", "code")
	snapRows := m.NewCounter("pgrelay_source_snapshot_rows")
	snapTables := m.NewCounter("pgrelay_source_snapshot_tables")
	return source.Hooks{
		Transactions: func(n int64) { txns.Incr(n) },
		SlotLag:      func(n int64) { lag.Set(n) },
		Messages:     func(n int64) { msgs.Incr(n) },
		Bundles:      func(n int64) { bundles.Incr(n) },
		PointerLSN:   func(lsn uint64) { ptr.Set(int64(lsn)) },
		Owner: func(o bool) {
			if o {
				owner.Set(1)
			} else {
				owner.Set(0)
			}
		},
		Error: func(code string) {
			if code == "" {
				code = "transient"
			}
			errs.Incr(1, code)
		},
		SnapshotRows:   func(n int64) { snapRows.Incr(n) },
		SnapshotTables: func(n int64) { snapTables.Incr(n) },
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
	b, err := p.src.Next(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		return nil, nil, err
	}
	batch := make(service.MessageBatch, len(b.Events))
	cover := string(b.CoverJSON)
	for i := range b.Events {
		e := &b.Events[i]
		m := service.NewMessage(e.Payload)
		m.MetaSetMut("queue", e.Queue)
		m.MetaSetMut("partition", e.Partition)
		m.MetaSetMut("message_id", e.ID)
		m.MetaSetMut("transaction_id", e.Tx)
		m.MetaSetMut("op", e.Op)
		m.MetaSetMut("table", e.Table)
		m.MetaSetMut("lsn", e.LSN)
		m.MetaSetMut("xid", strconv.FormatUint(uint64(e.Xid), 10))
		m.MetaSetMut("created_at", strconv.FormatInt(e.CreatedMs, 10))
		m.MetaSetMut("pgrelay_lease_key", b.LeaseKey)
		m.MetaSetMut("pgrelay_fence", b.Fence)
		m.MetaSetMut("pgrelay_pointer_key", b.PointerKey)
		m.MetaSetMut("pgrelay_cover", cover)
		batch[i] = m
	}
	return batch, func(ctx context.Context, err error) error {
		return p.src.Ack(ctx, b, err)
	}, nil
}

func (p *pgCDC) Close(ctx context.Context) error {
	if err := p.src.Close(ctx); err != nil {
		return fmt.Errorf("pg_cdc close: %w", err)
	}
	return nil
}
