package output

// The `pgrelay queue` subcommand registers itself from here, next to the redis_queue output.
import _ "github.com/pgrelay/pgrelay/internal/queuecli"
