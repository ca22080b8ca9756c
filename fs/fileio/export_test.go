package fileio

// MinIOTimeout exports minIOTimeout to the external tests.
var MinIOTimeout = minIOTimeout

// Files returns how many files the engine keeps state of.
func (e *Engine) Files() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.files)
}
