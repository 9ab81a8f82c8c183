package source

import (
	"strings"
	"testing"
)

func TestClusterSlotMatchesRedis(t *testing.T) {
	// Known slots from Redis' CLUSTER KEYSLOT.
	for tag, want := range map[string]uint16{"foo": 12182, "bar": 5061} {
		if got := clusterSlot(tag); got != want {
			t.Errorf("%s: slot %d, want %d", tag, got, want)
		}
	}
	c := Config{Tables: []Table{{Queue: "foo"}, {Queue: "bar"}}}
	c.Redis.ClusterURLs = []string{"redis://127.0.0.1:7000"}
	if err := c.checkClusterSlots(); err == nil || !strings.Contains(err.Error(), "cluster_slot") {
		t.Errorf("different slots accepted: %v", err)
	}
	c.Tables[1].Queue = "foo"
	if err := c.checkClusterSlots(); err != nil {
		t.Error(err)
	}
}
