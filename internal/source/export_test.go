package source

import (
	"context"
	"time"
)

// SetProgressEvery sets how often a snapshot logs its progress, for a test; it returns the old value.
func SetProgressEvery(d time.Duration) time.Duration {
	return time.Duration(progressEvery.Swap(int64(d)))
}

// SetStatusRefresh sets how often a replica writes its status entry again, for a test; it returns
// the old value.
func SetStatusRefresh(d time.Duration) time.Duration {
	return time.Duration(statusRefresh.Swap(int64(d)))
}

// PublicationSummary describes the named publications that exist, each as
// "insert,update,delete,truncate:tables" (t/f flags, table names sorted).
func PublicationSummary(ctx context.Context, q queryer, names ...string) (map[string]string, error) {
	rows, err := q.Query(ctx, `SELECT p.pubname, concat_ws(',', pubinsert, pubupdate, pubdelete, pubtruncate) || ':' ||
		coalesce((SELECT string_agg(tablename, ',' ORDER BY tablename) FROM pg_publication_tables t WHERE t.pubname = p.pubname), '')
		FROM pg_publication p WHERE p.pubname = ANY($1)`, names)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var name, what string
		if err := rows.Scan(&name, &what); err != nil {
			return nil, err
		}
		out[name] = what
	}
	return out, rows.Err()
}

// ChunksAhead and MaxUnwritten are the snapshot pipeline's chunk count (snapshot_share.go) and the
// batches that may wait for their pointer write (coverwriter.go), for tests that must stay past them.
const (
	ChunksAhead  = chunksAhead
	MaxUnwritten = maxUnwritten
)
