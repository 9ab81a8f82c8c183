// Package cdctest holds the fixtures that the integration tests under internal/ and the fault
// tests of tests/ share, on top of internal/testenv (real servers) and internal/oracle (the replay
// oracle). One copy of each:
//
//   - wait.go: Wait, WaitEvery and Poll, which ask a condition again and again until it holds or
//     a deadline passes, and then fail with what was awaited and the state last seen.
//   - writer.go: Writers, concurrent writers of random transactions until stopped, and RandomTx,
//     the random transaction over tables of shape WriterColumns.
//   - pipeline.go: Pipeline, the config of a pg_cdc → redis_queue pipeline (one Redis or a
//     Redis Cluster) for the stream builder or the binary.
//   - source.go: what tests read of a running source: SourceKey, ReadPointer, WaitCovered,
//     WaitStatus, and Conn and CurrentLSN on the PostgreSQL side.
//   - stream.go: RunStream and RunConsumer, a Benthos stream run in the background and stopped
//     when the test ends.
package cdctest
