package sink

import (
	"encoding/json"
	"reflect"
	"testing"
)

// TestScanObjectAgreesWithEncodingJSON: the fast scanner accepts exactly the objects encoding/json
// accepts and returns the same top-level keys and raw values.
func TestScanObjectAgreesWithEncodingJSON(t *testing.T) {
	docs := []string{
		`{}`, ` { } `, `{"a":1}`, `{"a":-0.5e+10,"b":"x\"y","c":[1,{"d":null}],"e":true,"f":false}`,
		`{"k\u00e9y":"v","k\\n":1}`, `{"big":123456789012345678901234567890}`, `{"a":{"b":{"c":[[],{}]}}}`,
		`{"a":1,"a":2}`, "{\"a\":\"tab\\there\"}", `{"u":"\u20ac\ud83d\ude00"}`,
		// invalid
		`{`, `{"a"}`, `{"a":}`, `{"a":1,}`, `{"a":01}`, `{"a":1.}`, `{"a":.5}`, `{"a":-}`, `{"a":1e}`, `{"a":tru}`,
		`{"a":"\x"}`, `{"a":"\u12"}`, "{\"a\":\"ctl\x01\"}", `{"a":[1,]}`, `{"a":1} x`, `{a:1}`, `{"a":[}`, `{"a":"unterminated}`,
		`{"a":1 "b":2}`, `{"a":nul}`,
	}
	for _, d := range docs {
		var want map[string]json.RawMessage
		wantErr := json.Unmarshal([]byte(d), &want)
		got, err := scanObject([]byte(d))
		if (err != nil) != (wantErr != nil) {
			t.Errorf("%s: scan err %v, encoding/json err %v", d, err, wantErr)
			continue
		}
		if err == nil && !reflect.DeepEqual(map[string]json.RawMessage(got), want) {
			t.Errorf("%s: scan %v, encoding/json %v", d, got, want)
		}
	}
}
