package fileio

// MinIOTimeout exports minIOTimeout to the external tests.
var MinIOTimeout = minIOTimeout
