package store

import "testing"

func TestSpan_WidensInClaimOrderAndKnowsWhenEmpty(t *testing.T) {
	var s Span
	if !s.Empty() {
		t.Fatal("the zero Span is not empty")
	}
	s = s.Widen(200, 7)
	if s != (Span{200, 7, 200, 7}) || s.Empty() {
		t.Fatalf("one row: %+v", s)
	}
	// Same due time: the id orders the rows, as in the claim's index.
	s = s.Widen(200, 3).Widen(200, 9)
	if s != (Span{200, 3, 200, 9}) {
		t.Fatalf("same due: %+v, want ids 3 to 9", s)
	}
	// An earlier due time comes first whatever its id, a later one last.
	s = s.Widen(100, 50).Widen(300, 1).Widen(250, 99)
	if s != (Span{100, 50, 300, 1}) {
		t.Fatalf("%+v, want (100, 50) to (300, 1)", s)
	}
	if !(Span{300, 1, 100, 50}).Empty() || !(Span{200, 9, 200, 3}).Empty() {
		t.Fatal("a span ending before it starts is not empty")
	}
}
