package source

import (
	"fmt"

	"github.com/pgrelay/pgrelay/internal/errcode"
)

// clusterSlot is Redis Cluster's hash slot of a key whose hash tag is tag: CRC16-XMODEM mod 16384.
func clusterSlot(tag string) uint16 {
	var crc uint16
	for i := 0; i < len(tag); i++ {
		crc ^= uint16(tag[i]) << 8
		for b := 0; b < 8; b++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % 16384
}

// checkClusterSlots refuses, on Redis Cluster, queues whose keys live in another slot than the
// first queue's (where the lease and pointer are): one batch is one script call on one slot.
func (c *Config) checkClusterSlots() error {
	if len(c.Redis.ClusterURLs) == 0 {
		return nil
	}
	first := clusterSlot(c.Tables[0].Queue)
	for i, t := range c.Tables[1:] {
		if s := clusterSlot(t.Queue); s != first {
			return errcode.New(errcode.ClusterSlot, fmt.Sprintf("tables[%d].queue %q is in Redis Cluster slot %d, the source's pointer in slot %d (queue %q)",
				i+1, t.Queue, s, first, c.Tables[0].Queue),
				"on Redis Cluster give every table of one source the same queue, or queues whose names hash alike (e.g. one source per queue)")
		}
	}
	return nil
}
