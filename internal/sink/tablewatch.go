package sink

import (
	"maps"
	"sync"
	"sync/atomic"
)

// tableWatch follows the event tables a cdc sink of one table meets. Such a sink applies every
// event to its one target whatever the event's table (copies of several tables need tables), so
// a table after the first is told (Config.OnOtherTable), once per table: on a queue of several
// tables that is most likely a mistake, though merging tables of one shape is a use.
type tableWatch struct {
	first atomic.Pointer[string]          // the first event table met
	met   atomic.Pointer[map[string]bool] // every table met, replaced whole when one is added
	mu    sync.Mutex                      // adds
	tell  func(first, table string)
}

func newTableWatch(tell func(first, table string)) *tableWatch {
	return &tableWatch{tell: tell}
}

// saw notes an event of table; a table met before costs no lock.
func (w *tableWatch) saw(table []byte) {
	if f := w.first.Load(); f != nil && *f == string(table) {
		return
	}
	if met := w.met.Load(); met != nil && (*met)[string(table)] {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	met := map[string]bool{}
	if m := w.met.Load(); m != nil {
		if (*m)[string(table)] {
			return
		}
		met = maps.Clone(*m)
	}
	name := string(table)
	met[name] = true
	w.met.Store(&met)
	if f := w.first.Load(); f == nil {
		w.first.Store(&name)
	} else {
		w.tell(*f, name)
	}
}
