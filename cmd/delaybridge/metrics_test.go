package main

import (
	"fmt"
	"testing"
)

func TestCapTopics_KeepsTheLargestAndSumsTheRest(t *testing.T) {
	topics := map[string]int{}
	total := 0
	for i := range 2000 {
		topics[fmt.Sprintf("t%04d", i)] = i
		total += i
	}
	got := capTopics(topics, maxTopicSeries)
	if len(got) != maxTopicSeries+1 {
		t.Fatalf("%d series from 2,000 topics, want %d", len(got), maxTopicSeries+1)
	}
	sum := 0
	for _, n := range got {
		sum += n
	}
	if sum != total || got["t1999"] != 1999 {
		t.Fatalf("sum %d (want %d), t1999 = %d", sum, total, got["t1999"])
	}
	if _, kept := got["t0000"]; kept {
		t.Fatal("the smallest topic kept its own series")
	}
	small := map[string]int{"a": 1, "b": 2}
	if got := capTopics(small, maxTopicSeries); len(got) != 2 || got[otherTopics] != 0 {
		t.Fatalf("few topics changed: %v", got)
	}
}
