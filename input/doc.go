// Package input registers pgrelay's Benthos inputs: pg_cdc (the PostgreSQL source) and redis_queue
// (the queue consumer). Each file is a plugin shell: its ConfigSpec, a constructor that parses the
// config into a plain struct, and a thin type that delegates to internal/.
package input
