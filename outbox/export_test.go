package outbox

// CountQuery is the background count's query, for EXPLAIN in tests.
const CountQuery = countQuery
