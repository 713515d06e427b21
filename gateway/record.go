package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/mandated/mandated/wire"
)

// member is one member the gateway puts in a record from the URL or a
// header; value is JSON already.
type member struct {
	name  string
	value []byte
}

func stringMember(name, s string) member {
	b, _ := json.Marshal(s)
	return member{name: name, value: b}
}

// fromURL are the members the gateway sets from the URL, the headers and
// its clock; a body naming one is refused (field_invalid). "executor" is
// not here: a begin may carry it in the body or in the Executor header.
var fromURL = []string{"v", "type", "org", "mandate_id", "authorization_id", "idempotency_key", "sent_at"}

// buildRecord makes the record the gateway produces: an object of the
// head members, then the body's members byte for byte as received (body is
// a JSON object ParseObject accepted, or empty). Nothing the caller sent is
// decoded and encoded again, so the processor's decoder judges exactly the
// bytes the gateway validated with it.
func buildRecord(head []member, body []byte) []byte {
	var b bytes.Buffer
	b.Grow(len(body) + 256)
	b.WriteByte('{')
	for i, m := range head {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Quote(m.name))
		b.WriteByte(':')
		b.Write(m.value)
	}
	rest := bytes.TrimLeft(body, " \t\r\n")
	if len(rest) == 0 {
		b.WriteByte('}')
		return b.Bytes()
	}
	rest = rest[1:] // the body's opening brace
	if inner := bytes.TrimLeft(rest, " \t\r\n"); len(inner) > 0 && inner[0] != '}' {
		b.WriteByte(',')
	}
	b.Write(rest)
	return b.Bytes()
}

// A request id names one accepted command: where its record is (the
// partition and offset of the proposals topic, so a status read can tell
// "not decided yet" from "no such request") and the nonce the record
// carried in its wire.HeaderRequest header, under which the processor
// keeps the decision: "rq-<partition>-<offset>-<nonce>".
type requestID struct {
	partition int32
	offset    int64
	nonce     string
}

func (id requestID) String() string {
	return fmt.Sprintf("rq-%d-%d-%s", id.partition, id.offset, id.nonce)
}

func parseRequestID(s string) (requestID, bool) {
	parts := strings.Split(s, "-")
	if len(parts) != 4 || parts[0] != "rq" || !wire.ValidRequestID(parts[3]) {
		return requestID{}, false
	}
	p, err1 := strconv.ParseInt(parts[1], 10, 32)
	o, err2 := strconv.ParseInt(parts[2], 10, 64)
	if err1 != nil || err2 != nil || p < 0 || o < 0 || strconv.FormatInt(p, 10) != parts[1] || strconv.FormatInt(o, 10) != parts[2] {
		return requestID{}, false
	}
	return requestID{partition: int32(p), offset: o, nonce: parts[3]}, true
}
