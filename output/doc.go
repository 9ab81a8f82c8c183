// Package output registers pgrelay's Benthos outputs: redis_queue (the queue producer) and pg_sink
// (the PostgreSQL sink). Each file is a plugin shell over the machinery in internal/.
package output
