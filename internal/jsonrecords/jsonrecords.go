// Package jsonrecords owns the JSON payloads that tests and benchmarks of compression store:
// records an application would publish (an order event with its customer, items and address),
// each of a size asked for, with keys repeated from record to record and values that vary,
// so that they compress as such payloads do and not as a repeated byte would.
package jsonrecords

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

var (
	kinds     = []string{"order.created", "order.paid", "order.shipped", "order.cancelled", "order.refunded"}
	firsts    = []string{"Alice", "Bob", "Carol", "Dave", "Erin", "Frank", "Grace", "Heidi", "Ivan", "Judy"}
	lasts     = []string{"Smith", "Jones", "Brown", "Taylor", "Wilson", "Garcia", "Müller", "Rossi"}
	tiers     = []string{"gold", "silver", "bronze", "none"}
	products  = []string{"widget", "gadget", "sprocket", "flange", "gasket", "bracket", "hinge", "spring"}
	cities    = []string{"Berlin", "Paris", "Lisbon", "Oslo", "Madrid", "Vienna", "Prague", "Dublin"}
	countries = []string{"DE", "FR", "PT", "NO", "ES", "AT", "CZ", "IE"}
	words     = strings.Fields(`please deliver to the back door after five leave parcel with neighbour
		call before arrival gift wrap requested fragile handle with care invoice to company address
		customer asked about express shipping replacement for damaged item discount code applied`)
)

type item struct {
	SKU      string  `json:"sku"`
	Name     string  `json:"name"`
	Qty      int     `json:"qty"`
	Price    float64 `json:"price"`
	Discount float64 `json:"discount"`
}

type record struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Time     string `json:"time"`
	Customer struct {
		ID    int    `json:"id"`
		Name  string `json:"name"`
		Email string `json:"email"`
		Tier  string `json:"tier"`
	} `json:"customer"`
	Items   []item `json:"items"`
	Address struct {
		Street  string `json:"street"`
		City    string `json:"city"`
		Zip     string `json:"zip"`
		Country string `json:"country"`
	} `json:"address"`
	Total    float64 `json:"total"`
	Currency string  `json:"currency"`
	Paid     bool    `json:"paid"`
	Note     string  `json:"note"`
}

// Gen makes records; the same seed makes the same records.
type Gen struct {
	r *rand.Rand
	n int
}

// New returns a Gen seeded with seed.
func New(seed uint64) *Gen { return &Gen{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))} }

func (g *Gen) pick(l []string) string { return l[g.r.IntN(len(l))] }

func (g *Gen) hex(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(g.r.Uint32())
	}
	return hex.EncodeToString(b)
}

func (g *Gen) price() float64 { return float64(g.r.IntN(100_000)) / 100 }

// Record returns one record of exactly size bytes of JSON: items are added while they fit,
// and the note, words from a small vocabulary, fills the rest. A size too small for a record
// without items gets that record, larger than asked.
func (g *Gen) Record(size int) []byte {
	g.n++
	var rec record
	rec.ID = g.hex(16)
	rec.Type = g.pick(kinds)
	rec.Time = time.Date(2026, 12, 8, 0, 0, 0, 0, time.UTC).Add(time.Duration(g.n)*time.Second + time.Duration(g.r.IntN(1e9))).Format(time.RFC3339Nano)
	rec.Customer.ID = g.r.IntN(10_000_000)
	rec.Customer.Name = g.pick(firsts) + " " + g.pick(lasts)
	rec.Customer.Email = strings.ToLower(rec.Customer.Name[:1]) + "." + g.hex(4) + "@example.com"
	rec.Customer.Tier = g.pick(tiers)
	rec.Address.Street = fmt.Sprintf("%d %s Street", 1+g.r.IntN(999), g.pick(lasts))
	rec.Address.City = g.pick(cities)
	rec.Address.Zip = fmt.Sprintf("%05d", g.r.IntN(100_000))
	rec.Address.Country = g.pick(countries)
	rec.Currency = "EUR"
	rec.Paid = g.r.IntN(2) == 0
	rec.Items = []item{}
	// Items are added by their own length, the total's digits given room for: marshalling the
	// whole record for each would make a large record cost the square of its size.
	length := len(marshal(&rec)) + 24
	for {
		it := item{SKU: fmt.Sprintf("SKU-%06d", g.r.IntN(1_000_000)), Name: g.pick(products), Qty: 1 + g.r.IntN(20), Price: g.price()}
		if g.r.IntN(3) == 0 {
			it.Discount = float64(g.r.IntN(5000)) / 100
		}
		add := len(marshal(&it))
		if len(rec.Items) > 0 {
			add++ // the comma
		}
		if length+add > size {
			break
		}
		length += add
		rec.Items = append(rec.Items, it)
		rec.Total += float64(it.Qty) * it.Price
	}
	rec.Total = float64(int64(rec.Total*100)) / 100
	out := marshal(&rec)
	var note strings.Builder
	for left := size - len(out); note.Len() < left; {
		if note.Len() > 0 {
			note.WriteByte(' ')
		}
		note.WriteString(g.pick(words))
	}
	rec.Note = note.String()[:max(size-len(out), 0)]
	return marshal(&rec)
}

func marshal(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // records and items have only strings, numbers and booleans
	}
	return b
}
