package broker

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// SignatureHeader is the free header that carries a message's signature:
// "<key id>:<base64 HMAC-SHA256>". Signed adds it; Verified checks and
// removes it, so handlers never see it.
const SignatureHeader = "delaybridge-sig"

// ErrForged means a delivery carries no valid signature from any accepted
// key: it was not published by a process holding the keys. The runtime
// sends it to dead; it says nothing about the task it names.
var ErrForged = errors.New("message signature missing or invalid")

// Key is one shared signing secret and the id that names it in signatures.
type Key struct {
	// ID names the key in the signature header: [A-Za-z0-9_-], 1 to 32
	// characters.
	ID string
	// Secret is at least 32 bytes.
	Secret []byte
}

// Keyring signs with its first key and accepts a signature by any of its
// keys. Rotate a key in three deployments: add the new key last
// everywhere; move it first everywhere (it now signs, the old one is still
// accepted); once no message signed with the old key can be in flight
// (the longest delay you schedule, or after a scanner pass), drop it.
type Keyring []Key

// ParseKeyring reads "id:base64secret" entries separated by commas or
// white space, the first being the signing key. Its errors name an entry
// by its position, never by its text: in an entry written the wrong way
// round ("base64secret:id") the id is the secret.
func ParseKeyring(s string) (Keyring, error) {
	var ring Keyring
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\t' || r == '\r' }) {
		id, enc, ok := strings.Cut(f, ":")
		if !ok {
			return nil, fmt.Errorf("signing key %d: want id:base64secret", len(ring)+1)
		}
		secret, err := base64.StdEncoding.DecodeString(enc)
		if err != nil {
			return nil, fmt.Errorf("signing key %d: the part after ':' is not base64; want id:base64secret, the id first", len(ring)+1)
		}
		ring = append(ring, Key{ID: id, Secret: secret})
	}
	return ring, ring.Validate()
}

// Validate reports an empty ring, a bad or repeated id, or a short secret.
func (r Keyring) Validate() error {
	if len(r) == 0 {
		return errors.New("signing keys: none given")
	}
	seen := map[string]bool{}
	for i, k := range r {
		if err := ValidateTopic(k.ID); err != nil || len(k.ID) > 32 {
			// Not quoted: an id this malformed may be a secret put first.
			return fmt.Errorf("signing key %d: the part before ':' is not an id of 1 to 32 of [A-Za-z0-9_-]; want id:base64secret, the id first", i+1)
		}
		if seen[k.ID] {
			return fmt.Errorf("signing key id %q appears twice", k.ID)
		}
		seen[k.ID] = true
		if len(k.Secret) < 32 {
			return fmt.Errorf("signing key %q: the secret has %d bytes, want at least 32", k.ID, len(k.Secret))
		}
	}
	return nil
}

// sign returns the signature header value of m under k.
func (k Key) sign(m *Message) string {
	mac := hmac.New(sha256.New, k.Secret)
	writeCanonical(mac, m)
	return k.ID + ":" + base64.RawStdEncoding.EncodeToString(mac.Sum(nil))
}

// verify reports whether m carries a valid signature by a key of r.
func (r Keyring) verify(m *Message) bool {
	id, _, ok := strings.Cut(m.Headers[SignatureHeader], ":")
	if !ok {
		return false
	}
	for _, k := range r {
		if k.ID == id {
			return hmac.Equal([]byte(m.Headers[SignatureHeader]), []byte(k.sign(m)))
		}
	}
	return false
}

// writeCanonical writes every field of m but the signature, each
// length-prefixed so no two messages share an encoding, and the payload's
// digest.
func writeCanonical(w interface{ Write([]byte) (int, error) }, m *Message) {
	field := func(s string) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		_, _ = w.Write(n[:])
		_, _ = w.Write([]byte(s))
	}
	field("delaybridge-sig-v1")
	field(strconv.FormatInt(m.TaskID, 10))
	field(m.Topic)
	field(m.Key)
	field(strconv.FormatInt(m.DeliverAt.UnixMilli(), 10))
	field(strconv.Itoa(m.Hop))
	field(strconv.Itoa(m.Attempt))
	field(strconv.FormatInt(m.Generation, 10))
	field(m.Trace)
	names := make([]string, 0, len(m.Headers))
	for k := range m.Headers {
		if k != SignatureHeader {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	for _, k := range names {
		field(k)
		field(m.Headers[k])
	}
	sum := sha256.Sum256(m.Payload)
	field(string(sum[:]))
}

// Signed returns a Publisher that signs each message with the ring's
// first key before pub publishes it. The caller's messages are not
// changed.
func Signed(pub Publisher, ring Keyring) Publisher {
	return signedPublisher{Publisher: pub, key: ring[0]}
}

type signedPublisher struct {
	Publisher
	key Key
}

func (p signedPublisher) Publish(ctx context.Context, msgs ...*Message) error {
	signed := make([]*Message, len(msgs))
	for i, m := range msgs {
		c := *m
		c.Headers = make(map[string]string, len(m.Headers)+1)
		for k, v := range m.Headers {
			c.Headers[k] = v
		}
		c.Headers[SignatureHeader] = p.key.sign(&c)
		signed[i] = &c
	}
	return p.Publisher.Publish(ctx, signed...)
}

// Verified returns a Subscriber whose deliveries without a valid signature
// by a key of ring carry ErrForged in Err (the runtime sends them to dead,
// running nothing); valid ones lose the signature header. Pair it with a
// Signed publisher for the consumer's own hops and retries.
func Verified(sub Subscriber, ring Keyring) Subscriber {
	return verifiedSubscriber{sub: sub, ring: ring}
}

type verifiedSubscriber struct {
	sub  Subscriber
	ring Keyring
}

func (s verifiedSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *Delivery, error) {
	in, err := s.sub.Subscribe(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := make(chan *Delivery)
	// Owned by the subscription: it ends when the inner channel closes,
	// which the inner subscriber does when ctx ends or it is closed.
	go func() {
		defer close(out)
		for d := range in {
			if d.Err == nil && d.Message != nil {
				if !s.ring.verify(d.Message) {
					d.Err = fmt.Errorf("%w: topic %s key %.64q", ErrForged, d.Message.Topic, d.Message.Key)
				} else {
					delete(d.Message.Headers, SignatureHeader)
					if len(d.Message.Headers) == 0 {
						d.Message.Headers = nil
					}
				}
			}
			out <- d
		}
	}()
	return out, nil
}
