package cli

// ValidShardName reports whether name may name a shard: 1 to 64 of
// [A-Za-z0-9_-], so it is safe in a URL, a log line and a metric label.
func ValidShardName(name string) bool {
	if name == "" || len(name) > 64 {
		return false
	}
	for _, c := range []byte(name) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
