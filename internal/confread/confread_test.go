package confread

import (
	"strings"
	"testing"

	"github.com/redpanda-data/benthos/v4/public/service"
)

func parse(t *testing.T, yaml string) *service.ParsedConfig {
	t.Helper()
	spec := service.NewConfigSpec().Fields(
		service.NewStringField("a"),
		service.NewIntField("b"),
		service.NewObjectListField("items", service.NewAnyField("n")),
	)
	conf, err := spec.ParseYAML(yaml, nil)
	if err != nil {
		t.Fatal(err)
	}
	return conf
}

func TestReaderValues(t *testing.T) {
	r := New(parse(t, "a: x\nb: 7\nitems: [{n: 1}, {n: 2}]\n"))
	a, b := r.String("a"), r.Int("b")
	var ns []int
	for _, item := range r.Objects("items") {
		ns = append(ns, item.Int("n"))
		if err := item.Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Err(); err != nil {
		t.Fatal(err)
	}
	if a != "x" || b != 7 || len(ns) != 2 || ns[0] != 1 || ns[1] != 2 {
		t.Fatalf("read a=%q b=%d items=%v", a, b, ns)
	}
}

// The first error is kept and later reads return zero values; an item's error names its path.
func TestReaderFirstError(t *testing.T) {
	r := New(parse(t, "a: x\nb: 1\nitems: []\n"))
	if n, a, b := r.Int("a"), r.String("a"), r.Int("b"); n != 0 || a != "" || b != 0 {
		t.Fatalf("after an error read a=%d, a=%q, b=%d, want zero values", n, a, b)
	}
	first := r.Err()
	if first == nil || strings.HasPrefix(first.Error(), "a: ") {
		t.Fatalf("section error %v: want the ParsedConfig's own error, unprefixed", first)
	}
	items := New(parse(t, "a: x\nb: 1\nitems: [{n: 1}, {n: x}]\n")).Objects("items")
	if items[0].Int("n") != 1 || items[0].Err() != nil {
		t.Fatalf("item 0: %v", items[0].Err())
	}
	items[1].Int("n")
	if err := items[1].Err(); err == nil || !strings.HasPrefix(err.Error(), "items[1].n: ") {
		t.Fatalf("item 1 error %v, want it to start with items[1].n: ", err)
	}
}
