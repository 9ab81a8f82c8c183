package source

import "testing"

// TestChunkLimit: a table's first chunk after pg_cdc starts reads at most FirstChunkRows rows; later ones
// read chunk_rows, or as many rows of the last chunk's mean width as make ChunkValueBytes, at
// least one.
func TestChunkLimit(t *testing.T) {
	for _, c := range []struct {
		name                string
		rowBytes, chunkRows int
		want                int
	}{
		{"first chunk", 0, 8000, FirstChunkRows},
		{"first chunk, chunk_rows smaller", 0, 5, 5},
		{"narrow rows: chunk_rows", 140, 8000, 8000},
		{"narrow rows, the default chunk_rows", 140, DefaultChunkRows, DefaultChunkRows},
		{"chunk_rows smaller than the bytes allow", 140, 100, 100},
		{"rows of 2 KiB", 2048, 8000, ChunkValueBytes / 2048},
		{"rows of 512 KiB", 512 << 10, 8000, 4},
		{"a row larger than the budget", 64 << 20, 8000, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			tab := &snapTable{rowBytes: c.rowBytes}
			if got := tab.limit(c.chunkRows); got != c.want {
				t.Errorf("limit(%d) with rows of %d bytes = %d, want %d", c.chunkRows, c.rowBytes, got, c.want)
			}
		})
	}
}
