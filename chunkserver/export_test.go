package chunkserver

// VerifyCopies exposes verifyCopies to the tests.
func VerifyCopies(shards [][]byte) ([]int, error) {
	bad, _, err := verifyCopies(RepairTask{}, shards, 0)
	return bad, err
}
