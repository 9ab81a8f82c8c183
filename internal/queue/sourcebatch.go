package queue

import "context"

// SourceBatch is what a source (pg_cdc) hands the redis_queue output for one covered batch: the
// cover and the receipt to mark. It travels in the context of every message of the batch, one
// value shared by all of them, instead of metadata set on each message (docs/batch-contract.md).
type SourceBatch struct {
	Cover   Cover
	Receipt *CoverReceipt
	// Chain is the source's chain, on every batch (Cover.Chain only on those registered with it):
	// the output offers it its window (Chain.Offer).
	Chain *Chain
	// Keys, when set, gives each message's queue, partition, id and transaction: the source set
	// no metadata on its messages (pg_cdc's `metadata: false`). nil when the messages carry them.
	Keys Keys
}

// Keys is the queue, partition, id and transaction of each message of a source batch, by its
// place in the batch, for messages that carry no metadata.
type Keys interface {
	// Len is the number of messages the source made.
	Len() int
	// Keys returns message i's queue, partition, id and transaction id.
	Keys(i int) (queue, partition, id, tx string)
}

type sourceBatchKey struct{}

// WithSourceBatch returns ctx carrying b.
func WithSourceBatch(ctx context.Context, b *SourceBatch) context.Context {
	return context.WithValue(ctx, sourceBatchKey{}, b)
}

// SourceBatchOf returns the SourceBatch ctx carries, or nil.
func SourceBatchOf(ctx context.Context) *SourceBatch {
	b, _ := ctx.Value(sourceBatchKey{}).(*SourceBatch)
	return b
}
